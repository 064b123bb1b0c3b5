"""One width for a batch's forward (strategies/batch_width.py): auto cuts every row's tree to the
width that pays for the whole batch, in each row's reach order, never a sampled (forced) node, and
the rows stay exactly what the target makes."""
from __future__ import annotations

import pytest

from conftest import char_tokenizer, hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.costmodel import CostProfile
from specdec.strategies.auto import Auto
from specdec.strategies.batch_width import best_width
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup

PROMPTS = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)\n    x = x + 1",
           "import os\nimport os\nimport", "while True:\n    pass\n"]
LENGTHS = [20, 7, 30, 25, 9]
FLAT = CostProfile((0, 64), (1.0, 1.0), 0, "flat")                # a node costs nothing: nothing is cut
STEEP = CostProfile((0, 64), (1.0, 1.0 + 64 * 0.25), 0, "steep")  # a node a row: a quarter of a plain forward


def test_best_width_by_hand():
    reaches, none_forced = [[0.9, 0.5], [0.9]], [0, 0]
    # tokens (1 + reach) over forward seconds: w0 2 / 1, w1 3.8 / 2, w2 4.3 / 3
    assert best_width(reaches, none_forced, lambda w: 1.0 + w, 0.0) == 0
    # w0 2 / 1, w1 3.8 / 1.2, w2 4.3 / 1.4
    assert best_width(reaches, none_forced, lambda w: 1.0 + 0.2 * w, 0.0) == 1
    # the step's other seconds count: w0 2 / 3, w1 3.8 / 4, w2 4.3 / 5
    assert best_width(reaches, none_forced, lambda w: 1.0 + w, 2.0) == 1
    assert best_width(reaches, none_forced, lambda w: 1.0, 0.0) == 2            # nodes free: the widest
    assert best_width(reaches, [2, 0], lambda w: 1.0 + w, 0.0) == 2             # forced nodes are never cut
    assert best_width([[], []], none_forced, lambda w: 1.0 + w, 0.0) == 0


def speculator(costs: CostProfile, draft: bool = True) -> Speculator:
    """auto with a draft model (every row drafts 3 nodes) or lookup alone (only rows whose text repeats
    have a tree: the rows' trees differ, and the widest one is what all rows would pay for)."""
    target = tiny_model("llama", seed=1, sharpen=4.0)
    drafter = DraftModel(noisy_copy(target), num_tokens=3) if draft else None
    strategy = Auto(PromptLookup(), drafter, costs=costs, profile=False, adapt_costs=False,
                    draft_cost_s=0.0, batch_gate=False)
    return Speculator(target, char_tokenizer(), strategy)


class Trims:
    """Spy on Auto.trim: (nodes the row planned, nodes kept, the width asked) per cut row."""

    def __init__(self, monkeypatch):
        self.cuts, self.drafted_kept, self.dropped_reach = [], [], []
        real = Auto.trim

        def trim(strategy, width):
            # the drafter's nodes come first in the merged tree (strategies/mixed.merge_paths)
            planned, drafted = list(strategy.pending.keep), set(range(strategy.pending.neural_tree.num_nodes))
            self.dropped_reach.append(sum(strategy.trim_reach[max(width, strategy.trim_forced):]))
            tree = real(strategy, width)
            self.cuts.append((len(planned), tree.num_nodes, width))
            self.drafted_kept.append(drafted <= set(strategy.pending.keep))
            return tree
        monkeypatch.setattr(Auto, "trim", trim)


@pytest.mark.parametrize("draft", [False, True])
def test_steep_batch_costs_cut_the_trees_and_every_row_stays_greedy(draft, monkeypatch):
    trims = Trims(monkeypatch)
    sd = speculator(STEEP, draft)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=4)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert trims.cuts and all(kept == width < planned for planned, kept, width in trims.cuts)


@pytest.mark.parametrize("draft", [False, True])
def test_flat_costs_cut_nothing_that_may_be_kept(draft, monkeypatch):
    """Nodes cost nothing: a cut drops only nodes that add no expected token (a tie goes to the
    narrower forward)."""
    trims = Trims(monkeypatch)
    sd = speculator(FLAT, draft)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=4)
    assert outs.stats.proposed_nodes > 0 and all(reach < 1e-6 for reach in trims.dropped_reach)


def test_cut_trees_fit_one_width(monkeypatch):
    """After the fit no row's tree is wider than the width the cut rows were cut to."""
    widths = []
    real = Auto.fit_batch

    def fit(rows, trees):
        cut = real(rows, trees)
        shrunk = [after.num_nodes for before, after in zip(trees, cut) if after.num_nodes < before.num_nodes]
        if shrunk:
            widths.append((max(shrunk), max(tree.num_nodes for tree in cut)))
        return cut
    monkeypatch.setattr(Auto, "fit_batch", staticmethod(fit))
    sd = speculator(STEEP, draft=False)
    sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=4)
    assert widths and all(widest == width for width, widest in widths)


def test_coupled_rows_with_cut_trees_are_the_autoregressive_text(monkeypatch):
    trims = Trims(monkeypatch)
    sd = speculator(STEEP)
    seeds = [3, 4, 5, 6, 7]
    kwargs = dict(temperature=0.9, top_k=30, sampler="coupled", ignore_eos=True)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, seed=seeds, batch_size=4, **kwargs)
    plain = Speculator(sd.target, sd.tokenizer, "autoregressive")
    for prompt, out, n, seed in zip(PROMPTS, outs, LENGTHS, seeds):
        assert out.token_ids == plain.generate(prompt, max_new_tokens=n, seed=seed, **kwargs).token_ids
    assert trims.cuts


def test_sampled_drafter_nodes_are_never_cut(monkeypatch):
    """Rejection sampling: the draft model's nodes were drawn, so they are verified whole; only
    lookup's nodes (point masses) may be cut. Lookup is made to look likely when sampling, so rows keep
    its nodes beside the drawn ones and the batch has something to cut."""
    from specdec.strategies import auto as auto_module
    from specdec.strategies.mixed import LOOKUP, NEURAL
    monkeypatch.setattr(auto_module, "PRIOR_ACCEPT_SAMPLED", {LOOKUP: (0.95, 0.95), NEURAL: (0.7, 0.7)})
    trims = Trims(monkeypatch)
    sd = speculator(STEEP)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, seed=[1, 2, 3, 4, 5], batch_size=4, temperature=0.9,
                       top_k=30, sampler="rejection", ignore_eos=True)
    assert [len(out.token_ids) for out in outs] == LENGTHS
    assert trims.drafted_kept and all(trims.drafted_kept)
    assert any(kept >= 3 for _, kept, _ in trims.cuts)          # a cut row kept its 3 drawn nodes


@pytest.mark.parametrize("costs", [FLAT, STEEP])
def test_one_row_is_planned_alone(costs, monkeypatch):
    """At batch 1 the row's own plan is the batch's: nothing to fit."""
    trims = Trims(monkeypatch)
    sd = speculator(costs)
    out = sd.generate(PROMPTS[2], max_new_tokens=20, ignore_eos=True)
    assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(PROMPTS[2])["input_ids"], 20, eos_token_id=None)
    assert trims.cuts == []
