"""early_exit's KV reuse (early_exit.reuse_kv): a chain drafts on the target's own cache, and the
verify runs layers < E only for what drafting did not feed.

* after every step (j of k drafted tokens accepted, 0 < j < k among them) the target's cache equals a
  fresh prefill of the committed text, layer by layer, the reused layers included;
* nothing runs twice: with reuse every layer runs the same token rows, the prompt included (without,
  the layers < E run more); the verify resumes every chain that drafting fed;
* greedy identity to Hugging Face generate(do_sample=False) with reuse on, adaptive and confidence-cut
  chains, a one-token prompt, budgets too short to draft and the target's logits processing included; the exact law (rejection sampler) and the coupled sampler are tests/test_early_exit.py's,
  which run with reuse on (its default) for chains;
* where reuse does not apply (trees, a split the probe refutes) the strategy drafts on a cache of its own,
  says why, and stays identical.
"""
from __future__ import annotations

import copy
from collections import Counter
from functools import lru_cache

import pytest
import torch

from conftest import hf_greedy, tiny_model
from specdec import Speculator
from specdec.errors import IncompatibleModelsError
from specdec.loop import decode
from specdec.sampling import SamplingParams
from specdec.stopping import StopRules
from specdec.strategies.early_exit import EarlyExit
from specdec.strategies.exit_split import SplitTarget
from specdec.types import Stats
from specdec.verifier import Verifier

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]


@lru_cache(maxsize=None)
def target_of(arch: str, layers: int = 3):
    return tiny_model(arch, seed=0, layers=layers, sharpen=3.0)


def steps_of(target, strategy, prompt=PROMPT, new_tokens=N, verifier=None):
    """Drive the loop one verify step at a time: yields (verifier, committed ids, the stats so far).
    Given a verifier, the strategy is bound already."""
    if verifier is None:
        verifier = Verifier(target)
        strategy.bind(target, None)
    committed = list(prompt)
    stats = Stats()
    for run, _ in decode(verifier, strategy, prompt, SamplingParams(0.0, 0, 1.0),
                         StopRules(max_new_tokens=new_tokens, eos_token_ids=frozenset()), torch.Generator(), stats):
        committed += run
        yield verifier, committed, stats


def assert_same_cache(cache, fresh, length: int) -> None:
    assert len(cache.layers) == len(fresh.layers)
    for i, (layer, expected) in enumerate(zip(cache.layers, fresh.layers)):
        assert layer.get_seq_length() == length, f"layer {i}"
        torch.testing.assert_close(layer.keys, expected.keys, rtol=1e-5, atol=1e-5, msg=f"keys of layer {i}")
        torch.testing.assert_close(layer.values, expected.values, rtol=1e-5, atol=1e-5, msg=f"values of layer {i}")


# ---------------------------------------------------------------------- the cache after each step
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_the_cache_after_each_step_is_a_fresh_prefill_of_the_committed_text(arch, exit_layer):
    target = target_of(arch)
    strategy = EarlyExit(exit_layer, num_tokens=4)
    partly, proposed_before = 0, 0
    for verifier, committed, stats in steps_of(target, strategy):
        assert strategy.sharing and strategy.cache.get_seq_length() == 0      # no draft cache of its own
        proposed, proposed_before = stats.proposed_nodes - proposed_before, stats.proposed_nodes
        partly += 0 < stats.accepted_lengths[-1] < proposed
        fresh = Verifier(target)
        fresh.prefill(committed[:-1])                   # every committed token but the pending one
        assert_same_cache(verifier.cache, fresh.cache, len(committed) - 1)
    # a tiny random GPT-2's layers add too little to its tied (sharpened) embeddings for its exits to
    # disagree: every chain is accepted there, and the cache is checked after every step all the same
    assert partly > 0 or arch == "gpt2", "no step accepted part of its chain: no rejected rows were cropped"


def test_negative_control_exit_states_from_the_wrong_positions_give_another_cache():
    """The cache test sees a wrong resume: exit states drafted one position off leave layers >= E with
    other keys than a fresh prefill's (the rotary embedding of llama reads the position)."""
    target = target_of("llama")
    strategy = EarlyExit(1, num_tokens=4)
    original = strategy._exit_logits

    def shifted(token, cache):
        strategy.prefix_len += 1
        try:
            return original(token, cache)
        finally:
            strategy.prefix_len -= 1

    strategy._exit_logits = shifted
    verifier, committed, _ = next(steps_of(target, strategy))
    fresh = Verifier(target)
    fresh.prefill(committed[:-1])
    with pytest.raises(AssertionError):
        assert_same_cache(verifier.cache, fresh.cache, len(committed) - 1)


# ---------------------------------------------------------------------- nothing runs twice
def layer_rows(target, strategy, prompt=PROMPT, new_tokens=N):
    """(token rows each of the target's layers ran, in layer order; the run's stats)."""
    # their probes are not the generation's rows; row_linear=0: every verify forward through the target's
    # own layers, where the hooks below are (the RowLinear twin's layers have registries of their own)
    verifier = Verifier(target, row_linear=0)
    strategy.bind(target, None)
    rows = Counter()
    handles = [layer.register_forward_pre_hook(lambda module, args, i=i: rows.update({i: args[0].shape[1]}))
               for i, layer in enumerate(target.model.layers)]
    try:
        *_, (_, committed, stats) = steps_of(target, strategy, prompt, new_tokens, verifier)
    finally:
        for handle in handles:
            handle.remove()
    return [rows[i] for i in range(len(target.model.layers))], committed, stats


def test_with_reuse_every_layer_runs_the_same_rows_once():
    target = target_of("llama", 4)
    rows, committed, stats = layer_rows(target, EarlyExit(2, num_tokens=4))
    verified = stats.target_forwards + stats.proposed_nodes          # [pending] + chain, every step
    assert rows == [len(PROMPT) - 1 + verified] * 4                   # the prefill, then each verify row once
    assert committed == PROMPT + hf_greedy(target, PROMPT, N, eos_token_id=None)


def test_without_reuse_the_lower_layers_run_the_prompt_and_the_drafts_again():
    target = target_of("llama", 4)
    shared, _, _ = layer_rows(target, EarlyExit(2, num_tokens=4))
    own, _, stats = layer_rows(target, EarlyExit(2, num_tokens=4, reuse_kv=False))
    assert own[2:] == shared[2:]                                      # layers >= E: the verify's rows alike
    assert own[0] == own[1] >= own[2] + len(PROMPT)                  # layers < E: the prompt a second time


# ---------------------------------------------------------------------- identity
@pytest.mark.parametrize("settings", [dict(num_tokens=4), dict(num_tokens=6, adaptive=True),
                                      dict(num_tokens=5, min_confidence=0.6)])
def test_greedy_identity_with_reuse(arch, settings):
    target = target_of(arch)
    strategy = EarlyExit(1, **settings)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert strategy.split is not None and strategy.reuse_off is None
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert sum(out.stats.accepted_lengths) > 0


def test_a_chain_the_verify_does_not_resume_is_dropped_first():
    """A tree handed without its lower_run (as auto hands a merged tree) after drafting wrote the chain's
    lower KV: the verify drops those rows and runs the whole target, with the same logits."""
    target = target_of("llama")
    strategy = EarlyExit(1, num_tokens=4)
    strategy.bind(target, None)
    verifier = Verifier(target)
    verifier.prefill(PROMPT[:-1])
    from specdec.types import DecodeState
    state = DecodeState(token_ids=list(PROMPT), prompt_len=len(PROMPT), sampling=SamplingParams(0.0, 0, 1.0),
                        rng=None, max_depth=N, target_cache=verifier.cache)
    strategy.reset(state)
    tree = strategy.propose(state)
    assert tree.lower_run is not None and verifier.cache.layers[0].get_seq_length() > len(PROMPT) - 1
    bare = type(tree)(tree.tokens, tree.parents)                       # the same chain, no lower_run
    got = verifier.forward(PROMPT[-1], bare).logits
    with torch.no_grad():
        expected = target(torch.cat([torch.tensor(PROMPT), tree.tokens])[None]).logits[0, len(PROMPT) - 1:]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    rows = len(PROMPT) + len(tree.tokens)                              # the prefix, then [pending] + chain once
    assert [layer.get_seq_length() for layer in verifier.cache.layers] == [rows] * len(verifier.cache.layers)


# ---------------------------------------------------------------------- where reuse does not apply
def test_trees_draft_on_a_cache_of_their_own_and_say_so():
    target = target_of("llama")
    strategy = EarlyExit(1, branching=[2, 2, 1])
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert strategy.split is None and "trees" in strategy.reuse_off
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)


def test_the_probe_refutes_a_split_that_adds_the_positions_twice():
    """GPT-2 adds its position embedding (wpe) before layer 0; the upper part must not add it to the exit
    states again. Put it back there and the probe refuses the split."""
    target = target_of("gpt2")
    split = SplitTarget(target, 1)
    split.check()
    split.upper.transformer.wpe = target.transformer.wpe
    with pytest.raises(IncompatibleModelsError, match="cannot be resumed from exit states"):
        split.check()


def test_a_refuted_split_drafts_on_a_cache_of_its_own(monkeypatch, caplog):
    def refuse(self):
        raise IncompatibleModelsError("early_exit.reuse_kv: refuted by the test")
    monkeypatch.setattr(SplitTarget, "check", refuse)
    target = target_of("llama")
    strategy = EarlyExit(1, num_tokens=4)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert strategy.split is None and "refuted by the test" in strategy.reuse_off
    assert "refuted by the test" in caplog.text
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)


def test_the_config_key_reaches_the_strategy():
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    target = target_of("llama")
    for value, sharing in (("true", True), ("false", False)):
        cfg = load_spec_config("early_exit", ["early_exit.exit_layer=1", f"early_exit.reuse_kv={value}"])
        strategy = build_strategy(cfg, target, None, target.device, target.dtype)
        Speculator(target, None, strategy)
        assert strategy.reuse_kv is sharing and (strategy.split is not None) is sharing


@pytest.mark.parametrize("prompt, new_tokens", [([5], N), (PROMPT, 1), (PROMPT, 2)])
def test_a_one_token_prompt_and_budgets_too_short_to_draft(prompt, new_tokens):
    """A one-token prompt leaves the target's cache empty before the first chain; a budget of one token
    leaves no room to draft (an empty tree, nothing written below E), one of two a single-token chain."""
    target = target_of("llama")
    strategy = EarlyExit(1, num_tokens=4)
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=new_tokens, ignore_eos=True)
    assert strategy.sharing
    assert out.token_ids == hf_greedy(target, prompt, new_tokens, eos_token_id=None)


def test_the_targets_logits_processing_with_reuse():
    """A generation_config that penalises repetition: the drafts are processed as the target's logits
    are, and the output is still generate()'s."""
    target = copy.deepcopy(target_of("llama"))
    target.generation_config.repetition_penalty = 1.5
    strategy = EarlyExit(1, num_tokens=4)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert strategy.sharing and sum(out.stats.accepted_lengths) > 0
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert out.token_ids != hf_greedy(target_of("llama"), PROMPT, N, eos_token_id=None)    # the penalty acted


def test_the_split_holds_in_bfloat16(arch):
    """The upper part adds nothing of another dtype to the exit states (GPT-2's zeroed position
    embedding is of the model's dtype): the probe passes on a bfloat16 target."""
    SplitTarget(copy.deepcopy(target_of(arch)).to(torch.bfloat16), 1).check()
