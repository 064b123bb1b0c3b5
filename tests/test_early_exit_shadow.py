"""early_exit's exit layer chosen from shadow tokens (early_exit.auto, strategies/shadow.py).

* the counts: on a hand-made step, layer E is counted accepted exactly at the rows where its argmax is
  the committed token; through a real generation, the counts equal those of a fresh forward over the
  committed text (every committed row counted, layer by layer);
* the choice follows the counts and the costs (best_exit), and on a target whose upper layers add
  nothing the strategy moves to the shallowest exit that is the whole model, mid-call where it drafts
  on the target's cache, at the next call where it drafts on a cache of its own;
* greedy identity to Hugging Face generate(do_sample=False) with the choice on, across a switch of E
  within a generation (reuse_kv on) and between calls (reuse_kv off), one sequence and a ragged batch;
* shadow tokens cost a bounded share of the steps: every step while the counts are young, then one in
  every; a strategy without auto asks for no hidden states;
* refusals: draft_cost with auto.
"""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, tiny_model
from test_early_exit import upper_layers_silenced
from specdec import Speculator
from specdec.errors import ConfigError
from specdec.strategies.early_exit import CHOOSE_ROWS, EarlyExit
from specdec.strategies.shadow import YOUNG_ROWS, ShadowCounts, ShadowHead, best_exit, shadow_matches

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]


@lru_cache(maxsize=None)
def target_of(arch: str, layers: int = 3):
    return tiny_model(arch, seed=0, layers=layers, sharpen=3.0)


def seed_counts(strategy: EarlyExit, acceptance: list[float], rows: int) -> None:
    """Counts as if `rows` committed rows had matched at each layer's `acceptance`."""
    strategy.counts.add(torch.tensor(acceptance) * rows, rows)


def switches(monkeypatch) -> list[int]:
    """The exit layers any EarlyExit (per-call copies included) moves to, in order, recorded as it switches."""
    moved = []
    use_exit = EarlyExit._use_exit

    def recording(self, exit_layer: int) -> None:
        if exit_layer != self.exit_layer:
            moved.append(exit_layer)
        use_exit(self, exit_layer)

    monkeypatch.setattr(EarlyExit, "_use_exit", recording)
    return moved


# ---------------------------------------------------------------------- the counts
def test_a_layer_counts_exactly_the_rows_where_its_argmax_is_the_committed_token():
    head = ShadowHead(torch.nn.Identity(), torch.nn.Linear(3, 3, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(3))           # logits = the state: argmax = its largest entry
    shadow_tokens = [[0, 2], [1, 2], [0, 2]]              # [row][layer]: what layers 1 and 2 would draft
    hidden = torch.cat([torch.eye(3)[torch.tensor(row)].reshape(1, -1) for row in shadow_tokens])   # [3, 2 * 3]
    committed = torch.tensor([0, 1, 2])                   # the token the target committed after each row
    expected = [sum(row[layer] == int(token) for row, token in zip(shadow_tokens, committed)) for layer in range(2)]
    assert shadow_matches(hidden, committed, head).tolist() == expected == [2, 1]


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_the_counts_are_those_of_a_fresh_forward_over_the_committed_text(reuse_kv):
    target = target_of("llama", 4)
    strategy = EarlyExit(1, num_tokens=3, auto=True, every=1, reuse_kv=reuse_kv)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    text = PROMPT + out.token_ids
    rows = int(strategy.counts.rows)                      # every step but the last (it stops; no observe)
    assert 0 < rows < N + 1
    with torch.no_grad():
        hidden_states = target(torch.tensor([text]), output_hidden_states=True).hidden_states
    first = len(PROMPT) - 1                               # the first committed row: the prompt's pending token
    following = torch.tensor(text[first + 1: first + 1 + rows])
    expected = [int((target.lm_head(target.model.norm(hidden_states[layer][0, first: first + rows])).argmax(-1)
                     == following).sum()) for layer in range(1, 4)]
    assert strategy.counts.matches.tolist() == expected
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)


# ---------------------------------------------------------------------- the choice
def test_the_choice_follows_the_counts():
    assert best_exit([0.9, 0.2, 0.3], 4, [4]) == 1
    assert best_exit([0.1, 0.9, 0.2], 4, [4]) == 2
    assert best_exit([0.05, 0.1, 0.99], 4, [4]) == 3


def test_the_choice_follows_the_costs():
    acceptance = [0.5, 0.9, 0.92]
    assert best_exit(acceptance, 4, [4]) == 2                             # E / L: layer 3 costs more than it gains
    assert best_exit(acceptance, 4, [4], draft_cost=lambda e: 0.01 if e == 3 else 0.5) == 3
    assert best_exit([0.6, 0.6, 0.6], 4, [4]) == 1                        # equal acceptance: the cheapest


def test_counts_smooth_and_halve_past_the_cap():
    counts = ShadowCounts(2, "cpu")
    assert counts.acceptance() == [0.5, 0.5]                              # nothing counted: the prior
    counts.add(torch.tensor([3.0, 0.0]), 3)
    assert counts.acceptance() == pytest.approx([4 / 5, 1 / 5])
    counts.add(torch.tensor([5000.0, 0.0]), 5000)
    assert counts.rows < 5003 and counts.acceptance() == pytest.approx([(5003 / 2 + 1) / (5003 / 2 + 2), 1 / (5003 / 2 + 2)])


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_a_layer_that_is_the_whole_model_is_chosen(reuse_kv, monkeypatch):
    """Layers 2 and 3 of 4 add nothing: an exit at 2 drafts the target's own tokens, at 1 it guesses; exit 3
    accepts as much as 2 at a higher cost. Started at 1, the strategy moves to 2: within the call where it
    drafts on the target's cache, at the next call where it drafts on a cache of its own."""
    target = upper_layers_silenced(target_of("llama", 4), 2)
    strategy = EarlyExit(1, num_tokens=4, auto=True, every=2, reuse_kv=reuse_kv)
    sd = Speculator(target, None, strategy)
    used = switches(monkeypatch)
    first = sd.generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert first.token_ids == hf_greedy(target, PROMPT, 48, eos_token_id=None)
    assert strategy.counts.rows >= CHOOSE_ROWS
    acceptance = strategy.counts.acceptance()
    assert acceptance[1] == acceptance[2] > acceptance[0]
    assert used == ([2] if reuse_kv else [])
    second = sd.generate(PROMPT[::-1], max_new_tokens=N, ignore_eos=True)
    assert second.token_ids == hf_greedy(target, PROMPT[::-1], N, eos_token_id=None)
    assert used == [2] and strategy.exit_layer == 2
    assert sum(second.stats.accepted_lengths) == N - second.stats.target_forwards   # every drafted token kept


# ---------------------------------------------------------------------- greedy identity across switches
@pytest.mark.parametrize("reuse_kv", [True, False])
def test_greedy_identity_across_a_switch(arch, reuse_kv, monkeypatch):
    """Counts seeded just short of CHOOSE_ROWS, strongly for layer 2: the call starts at exit 1 and moves
    to 2 after its first steps (drafting on the target's cache) or at the next call (on a cache of its own)."""
    target = target_of(arch)
    strategy = EarlyExit(1, num_tokens=3, auto=True, every=2, reuse_kv=reuse_kv)
    sd = Speculator(target, None, strategy)
    seed_counts(strategy, [0.0, 1.0], CHOOSE_ROWS - 2)
    used = switches(monkeypatch)
    assert sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids == \
        hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert used == ([2] if reuse_kv and strategy.split is not None else [])
    assert sd.generate(PROMPT[::-1], max_new_tokens=N, ignore_eos=True).token_ids == \
        hf_greedy(target, PROMPT[::-1], N, eos_token_id=None)
    assert used == [2]


def test_ragged_batch_with_the_choice_on(arch, monkeypatch):
    target = target_of(arch)
    tokenizer = char_tokenizer()
    prompts = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "ab"]
    lengths = [20, 7, 30, 12]
    strategy = EarlyExit(1, num_tokens=3, auto=True)
    sd = Speculator(target, tokenizer, strategy)
    seed_counts(strategy, [0.0, 1.0], CHOOSE_ROWS)        # every row starts at exit 2
    used = switches(monkeypatch)
    outs = sd.generate(prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(prompts, outs, lengths):
        assert out.token_ids == hf_greedy(target, tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert used == [2] * len(prompts)                      # each row's copy moved from 1 to 2 as it started


# ---------------------------------------------------------------------- what it costs
def test_shadow_tokens_on_every_step_while_young_then_one_in_every():
    target = target_of("llama", 4)
    strategy = EarlyExit(1, num_tokens=3, auto=True, every=4)
    sd = Speculator(target, None, strategy)
    asked = []
    count_shadows = strategy._count_shadows
    strategy._count_shadows = lambda state, result: (asked.append(result.hidden is not None),
                                                     count_shadows(state, result))
    sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert asked and all(asked)                           # young: every step
    seed_counts(strategy, [0.5, 0.5, 0.5], YOUNG_ROWS)
    asked.clear()
    sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert len(asked) > 4 and asked == [step % 4 == 0 for step in range(len(asked))]


def test_without_auto_no_hidden_states_are_asked():
    strategy = EarlyExit(1, num_tokens=3)
    sd = Speculator(target_of("llama"), None, strategy)
    seen = []
    observe = strategy.observe
    strategy.observe = lambda state, result: (seen.append(result.hidden), observe(state, result))
    sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert seen and all(hidden is None for hidden in seen) and not strategy.needs_hidden_states


# ---------------------------------------------------------------------- refusals and config
def test_draft_cost_with_auto_is_refused():
    with pytest.raises(ConfigError, match="draft_cost=0.3 prices one fixed exit layer"):
        EarlyExit(1, auto=True, draft_cost=0.3)


def test_the_config_builds_a_choosing_strategy():
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    target = target_of("llama")
    cfg = load_spec_config("early_exit", ["early_exit.auto=true", "early_exit.every=3"])
    strategy = build_strategy(cfg, target, None, target.device, target.dtype)
    assert strategy.auto and strategy.every == 3
    with pytest.raises(ConfigError, match="every"):
        load_spec_config("early_exit", ["early_exit.every=0"])


def test_the_host_reads_it_adds_are_one_per_choice(monkeypatch):
    """Against the same drafts with auto off (the counts seeded past young, at the exit it starts at): the
    engine reads nothing more, the strategy one read per choice, one at each call's start and one after
    each step of its every-N cadence; shadow tokens themselves stay on the device."""
    from host_reads import HostReads
    target = target_of("llama", 4)
    reads = {}
    for auto in (False, True):
        strategy = EarlyExit(1, num_tokens=3, auto=auto, every=4)
        sd = Speculator(target, None, strategy)
        if auto:
            seed_counts(strategy, [0.9, 0.0, 0.0], YOUNG_ROWS)        # exit 1 stays the choice
            choices = []
            acceptance = ShadowCounts.acceptance
            monkeypatch.setattr(ShadowCounts, "acceptance", lambda self: choices.append(1) or acceptance(self))
        with HostReads() as syncs:
            out = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
        reads[auto] = syncs.by_area()
    steps = out.stats.target_forwards
    assert strategy.exit_layer == 1 and reads[True]["engine"] == reads[False]["engine"]
    assert len(choices) == 1 + len(range(0, steps - 1, 4))       # the last step stops: no observe, no choice
    assert reads[True]["strategy"] - reads[False]["strategy"] == len(choices)
