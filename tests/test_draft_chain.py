"""draft_model's table chain (draft.table_chain, strategies/leaf_chain.py): the draft's chain (or tree) continued by
the target's own top-1 predictions, at no draft forward. Greedy identity on one sequence and a ragged batch, chains
and trees; the chain's nodes are kept where the target repeats itself; the draft's cache stays what a full forward
over the committed text gives after the chain's accepted tokens (fed to it at the next catch-up); adaptive chain
lengths count the draft's own nodes only; the chain is off at a temperature and refused below 0."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_ragged_batch_greedy_identical, char_tokenizer, hf_greedy, noisy_copy, tiny_model
from eagle_helpers import biased_target
from specdec import Speculator
from specdec.errors import ConfigError
from specdec.strategies.draft_model import DraftModel, node_runs

PROMPT = [5, 9, 3, 5, 9, 3, 5, 9, 3, 5]


@pytest.mark.parametrize("nodes,runs", [([], []), ([3], [(3, 4)]), ([2, 3, 4], [(2, 5)]),
                                        ([4, 9, 10, 11], [(4, 5), (9, 12)]), ([1, 3, 5], [(1, 2), (3, 4), (5, 6)])])
def test_node_runs(nodes, runs):
    """An accepted path's nodes the draft was not fed, as slices of the tree's tokens: a tree's deepest leaf and
    the chain's nodes after the tree's are two runs."""
    assert node_runs(nodes) == runs


@pytest.mark.parametrize("shape", [{"num_tokens": 1}, {"num_tokens": 3}, {"branching": [2, 2]}])
def test_a_draft_with_a_chain_is_greedy_identical(arch, shape):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    strategy = DraftModel(noisy_copy(target, 0.3), table_chain=4, **shape)
    assert strategy.top_k_ids == 1
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)
        assert out.stats.proposed_nodes > 0


@pytest.mark.parametrize("shape", [{"num_tokens": 2}, {"branching": [2, 1]}])
def test_a_draft_with_a_chain_is_greedy_identical_in_a_ragged_batch(arch, shape):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    assert_ragged_batch_greedy_identical(Speculator(target, char_tokenizer(),
                                                    DraftModel(noisy_copy(target, 0.3), table_chain=3, **shape)))


def test_no_chain_no_top_ids_and_a_negative_length_is_refused():
    target = tiny_model("llama", seed=1)
    assert DraftModel(noisy_copy(target), table_chain=0).top_k_ids == 0      # nothing computed for a chain not asked
    with pytest.raises(ConfigError, match="draft.table_chain"):
        DraftModel(noisy_copy(target), table_chain=-1)


def test_the_chain_is_kept_where_the_target_repeats_itself():
    """A target that always says 7, with a copy of it as the draft: one drafted token makes at most one kept token a
    forward; after a step the table says 7 after 7, so the chain under the drafted token adds more."""
    target = biased_target("llama", 5.0, keep_weights=False)
    per_forward = {}
    for length in (0, 4):
        out = Speculator(target, None, DraftModel(noisy_copy(target, 0.0), num_tokens=1, table_chain=length)) \
            .generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, PROMPT, 40, min_new_tokens=40)
        per_forward[length] = sum(out.stats.accepted_lengths) / out.stats.target_forwards
    assert per_forward[4] > per_forward[0] + 1.5


class Recording(DraftModel):
    """A DraftModel that keeps, at each catch-up, the committed ids and the draft's logits at the last of them."""

    def _catch_up(self, token_ids, pending=None):
        logits = super()._catch_up(token_ids, pending)
        self.seen.append((list(token_ids), logits.clone()))
        return logits


SHAPES = [{"num_tokens": 1}, {"num_tokens": 2}, {"branching": [1, 1]}, {"branching": [2, 2]}]


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_drafts_cache_takes_the_chains_accepted_tokens(lean, shape, monkeypatch):
    """After steps that keep chain nodes (accepted tokens the draft was not fed: with a tree of two children a node,
    the deepest leaf and the chain's nodes after the tree's), the next catch-up feeds them from the device, with no
    copy of the committed ids from the host after the prompt's: the draft's logits at the pending token are those
    of one forward over the whole text."""
    from specdec.strategies import draft_model
    copies = []
    real = draft_model.host_to_device
    monkeypatch.setattr(draft_model, "host_to_device", lambda ids, device: copies.append(len(ids)) or real(ids, device))
    target = biased_target("llama", 5.0, keep_weights=False)
    draft = noisy_copy(target, 0.0)
    strategy = Recording(draft, table_chain=4, lean_forward=lean, **shape)
    strategy.seen = []
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=30, ignore_eos=True)
    depth = shape.get("num_tokens") or len(shape["branching"])
    assert max(out.stats.accepted_lengths) > depth              # steps kept the chain's nodes past the drafted ones
    assert len(strategy.seen) >= 4 and copies == [len(PROMPT)]
    with torch.no_grad():
        for token_ids, logits in strategy.seen:
            full = draft(torch.tensor([token_ids])).logits[0, -1]
            torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [{"num_tokens": 2}, {"branching": [2, 2]}])
def test_a_batched_drafts_cache_takes_the_chains_accepted_tokens(shape, monkeypatch):
    """The same in a batch (strategies/draft_batch.py): each row's catch-up, chain nodes kept, gives the draft's
    logits of one forward over that row's text, and a step's catch-up is one forward."""
    from specdec.strategies.draft_batch import DraftBatch
    seen, forwards = [], []
    real_catch_up, real_forward = DraftBatch.catch_up, DraftBatch._forward

    def catch_up(self, drafters, states, under_tree=False):
        texts = [list(state.token_ids) for state in states]
        forwards.append(0)
        self.catching_up = True
        out = real_catch_up(self, drafters, states, under_tree)
        self.catching_up = False
        seen.extend(zip(texts, [logits.clone() for logits in (out[0] if under_tree else out)]))
        return out

    def forward(self, *args, **kwargs):
        if getattr(self, "catching_up", False):
            forwards[-1] += 1
        return real_forward(self, *args, **kwargs)
    monkeypatch.setattr(DraftBatch, "catch_up", catch_up)
    monkeypatch.setattr(DraftBatch, "_forward", forward)
    target = biased_target("llama", 5.0, keep_weights=False)
    draft = noisy_copy(target, 0.0)
    prompts = [PROMPT, PROMPT[:4], PROMPT[::-1] + PROMPT]
    outs = Speculator(target, None, DraftModel(draft, table_chain=4, **shape)).generate(
        prompts, max_new_tokens=[30, 22, 26], ignore_eos=True)
    for prompt, out, n in zip(prompts, outs, [30, 22, 26]):
        assert out.token_ids == hf_greedy(target, prompt, n, min_new_tokens=n)
    assert max(outs.stats.accepted_lengths) > (shape.get("num_tokens") or 2)
    assert len(seen) > 6 and forwards[1:] and max(forwards[1:]) == 1     # after the prompts', one forward a catch-up
    with torch.no_grad():
        for token_ids, logits in seen:
            full = draft(torch.tensor([token_ids])).logits[0, -1]
            torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)


def test_adaptive_lengths_count_the_drafts_own_nodes():
    """The acceptance history of an adaptive chain is the draft's: on steps that keep the table chain's nodes past
    the drafted ones, what the chain length learns from is the drafted nodes alone (a chain's kept nodes are no
    evidence for a longer draft)."""
    target = biased_target("llama", 5.0, keep_weights=False)
    strategy = DraftModel(noisy_copy(target, 0.0), adaptive=True, num_tokens=2, min_tokens=1, max_tokens=3,
                          table_chain=4)
    seen = []

    def adapt(accepted, proposed):
        seen.append((accepted, proposed, strategy.drafted, strategy.last_accepted))
    strategy._adapt = adapt
    original = strategy.observe

    def observe(state, result):
        strategy.last_accepted = result.num_accepted
        original(state, result)
    strategy.observe = observe
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=30, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, 30, min_new_tokens=30)
    assert seen and all(proposed == drafted and accepted <= proposed for accepted, proposed, drafted, _ in seen)
    assert any(kept > drafted for _, _, drafted, kept in seen)      # the chain's nodes were kept, and not counted


def test_no_chain_at_a_temperature():
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = DraftModel(noisy_copy(target, 0.3), num_tokens=2, table_chain=4)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=16, ignore_eos=True, temperature=0.8,
                                                      seed=0)
    assert len(out.token_ids) == 16 and not strategy.chain.nodes and out.stats.proposed_nodes <= 2 * out.stats.target_forwards
