"""`draft.dtype`: a draft model drafting in another dtype than its target's. Only drafting changes: greedy
output stays the target's, one sequence and a ragged batch, through the lean and Hugging Face's forward; the
output law through the rejection sampler stays the target's (the drafts carry the probabilities they were
drawn from in the draft's dtype); a float16 draft whose activations overflow is stopped with an error that
says what to do, where float32 runs the same draft."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import hf_greedy, noisy_copy, save_target_and_draft, tiny_model
from specdec import Speculator
from specdec.errors import ConfigError, StrategyError
from specdec.strategies.draft_model import DraftModel

PROMPTS = [[1, 5, 9, 14, 3, 7, 22, 40, 5, 9], [2, 8, 8, 30, 41, 6, 17, 9, 3, 12, 50, 4]]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("lean", [True, False])
def test_a_draft_in_another_dtype_drafts_in_it_and_stays_identical(dtype, lean):
    target = tiny_model("llama", seed=0, sharpen=6.0)
    strategy = DraftModel(noisy_copy(target, noise=0.1), num_tokens=3, lean_forward=lean, dtype=dtype)
    sd = Speculator(target, None, strategy)
    assert {p.dtype for p in strategy.draft.parameters()} == {getattr(torch, dtype)}
    assert {p.dtype for p in target.parameters()} == {torch.float32}      # the target verifies in its own
    accepted = 0
    for prompt in PROMPTS:
        out = sd.generate(prompt, max_new_tokens=30, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 30, eos_token_id=None)
        accepted += sum(out.stats.accepted_lengths)
    assert accepted > 0


def test_a_float16_draft_stays_identical_in_a_ragged_batch():
    target = tiny_model("llama", seed=0, sharpen=6.0)
    sd = Speculator(target, None, DraftModel(noisy_copy(target, noise=0.1), num_tokens=3, dtype="float16"))
    outs = sd.generate(PROMPTS, max_new_tokens=24, ignore_eos=True)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_exact_law_through_the_rejection_sampler_with_a_16_bit_draft(dtype):
    """The law of three tokens on a 5-token vocabulary, every draw enumerated, with drafts drawn in 16 bits; a
    verifier that accepts every draft breaks it."""
    from self_draft import LAW_CASES, LAW_TARGET, check_always_accept_breaks_the_law, check_output_law
    check_output_law(DraftModel(noisy_copy(LAW_TARGET, noise=0.2), num_tokens=2, dtype=dtype), LAW_CASES[0][1])
    check_always_accept_breaks_the_law(DraftModel(noisy_copy(LAW_TARGET, noise=0.2), num_tokens=2, dtype=dtype))


def _overflowing_draft(target, where: str):
    """A draft whose residual stream exceeds float16's range (65504) at its first layer's output (NaN logits after
    the final norm), or whose logits do (infinite logits)."""
    draft = noisy_copy(target, noise=0.1)
    with torch.no_grad():
        if where == "residual":
            draft.model.layers[0].mlp.down_proj.weight.mul_(1e7)
        else:
            draft.model.norm.weight.mul_(3e4)
    return draft


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("where", ["residual", "logits"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_float16_overflow_is_stopped_saying_what_to_do(lean, where, temperature):
    target = tiny_model("llama", seed=0, sharpen=6.0)
    sd = Speculator(target, None, DraftModel(_overflowing_draft(target, where), num_tokens=3, lean_forward=lean,
                                             dtype="float16"))
    with pytest.raises(StrategyError, match=r"float16 forward overflowed.*draft\.dtype=bfloat16"):
        sd.generate(PROMPTS[0], max_new_tokens=8, ignore_eos=True, temperature=temperature)
    # the same draft in float32 drafts badly but runs, and the target's text is unchanged
    sd = Speculator(target, None, DraftModel(_overflowing_draft(target, where), num_tokens=3, lean_forward=lean))
    assert sd.generate(PROMPTS[0], max_new_tokens=8, ignore_eos=True).token_ids == hf_greedy(
        target, PROMPTS[0], 8, eos_token_id=None)


def test_the_rotary_frequencies_stay_in_float32():
    """In 16 bits the rotary embeddings' inverse frequencies would put a cosine at position 1000 off by tenths."""
    target = tiny_model("llama", seed=0)
    strategy = DraftModel(noisy_copy(target), dtype="bfloat16")
    strategy.bind(target, None)
    buffers = dict(strategy.draft.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert {p.dtype for p in strategy.draft.parameters()} == {torch.bfloat16}


def test_a_draft_sharing_the_targets_weights_is_not_converted():
    target = tiny_model("llama", seed=0)
    with pytest.raises(ConfigError, match="shares weights with the target"):
        DraftModel(target, dtype="float16").bind(target, None)
    assert {p.dtype for p in target.parameters()} == {torch.float32}


def test_the_config_key_reaches_the_draft_and_a_bad_dtype_is_refused(tmp_path):
    folders = save_target_and_draft(tmp_path)
    paths = {"target.path": folders["target"], "draft.path": folders["draft"]}
    sd = specdec.load("draft_model", **paths, **{"draft.dtype": "bfloat16"})
    assert sd.strategy.draft.dtype == torch.bfloat16
    assert specdec.load("draft_model", **paths).strategy.draft.dtype == torch.float32     # null: the target's
    with pytest.raises(ConfigError, match="draft.dtype"):
        specdec.load("draft_model", **paths, **{"draft.dtype": "float64"})
