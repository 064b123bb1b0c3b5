"""LeanForward (strategies/lean_forward.py): a Llama-family draft's forward as plain tensor code gives the
model's own logits and KV cache, row for row, on every kind of call draft_model makes (a prompt chunk, one
token, the step's catch-up of two, a tree level under a tree mask); models it cannot run keep their own
forward; draft_model with it stays identical to Hugging Face's greedy generate()."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specdec import Speculator
from specdec.cache import new_cache
from specdec.models import cache_kwargs
from specdec.tree import tree_attention_mask, tree_position_ids
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.lean_forward import LeanForward, why_not_lean

from conftest import hf_greedy, noisy_copy, tiny_model

LEAN_ARCHS = ["llama", "qwen2", "mistral"]


def _own(model, cache, ids, mask=None, positions=None):
    """[L, V] the model's own forward's logits."""
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(model, cache),
                 use_cache=True).logits[0]


def _same_cache(a, b) -> None:
    for layer_a, layer_b in zip(a.layers, b.layers):
        assert layer_a.get_seq_length() == layer_b.get_seq_length()
        torch.testing.assert_close(layer_a.keys[..., : layer_a.get_seq_length(), :],
                                   layer_b.keys[..., : layer_b.get_seq_length(), :])
        torch.testing.assert_close(layer_a.values[..., : layer_a.get_seq_length(), :],
                                   layer_b.values[..., : layer_b.get_seq_length(), :])


@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_lean_logits_and_cache_are_the_models_own_on_every_kind_of_call(arch):
    model = tiny_model(arch, seed=3, hidden=64)
    lean = LeanForward(model)
    gen = torch.Generator().manual_seed(0)
    own_cache, lean_cache = new_cache(model), new_cache(model)
    with torch.inference_mode():
        for ids in (torch.randint(3, 96, (1, 9), generator=gen),     # a prompt chunk: causal rows, no mask given
                    torch.randint(3, 96, (1, 1), generator=gen),     # a chain token
                    torch.randint(3, 96, (1, 2), generator=gen)):    # a step's catch-up (tail + pending)
            torch.testing.assert_close(lean(ids, None, None, lean_cache), _own(model, own_cache, ids))
            _same_cache(lean_cache, own_cache)
        # a tree level: 4 nodes under the pending token, two of them siblings, each seeing its ancestors only
        parents = (-1, 0, 0, 1)
        prefix = own_cache.get_seq_length()
        mask = tree_attention_mask(parents, prefix, model.dtype, "cpu")
        positions = tree_position_ids(parents, prefix)
        ids = torch.randint(3, 96, (1, 4), generator=gen)
        torch.testing.assert_close(lean(ids, mask, positions, lean_cache), _own(model, own_cache, ids, mask, positions))
        _same_cache(lean_cache, own_cache)
        # the last row alone, as a catch-up asks
        ids = torch.randint(3, 96, (1, 3), generator=gen)
        torch.testing.assert_close(lean(ids, None, None, lean_cache, last_only=True), _own(model, own_cache, ids)[-1:])


def test_models_it_cannot_run_keep_their_own_forward():
    assert why_not_lean(tiny_model("llama")) is None
    assert "model_type" in why_not_lean(tiny_model("gpt2"))
    windowed = copy.deepcopy(tiny_model("mistral"))
    windowed.config.sliding_window = 16
    assert "sliding" in why_not_lean(windowed)
    stand_in = copy.deepcopy(tiny_model("llama"))

    class Silent(nn.Module):              # a layer_skip-style stand-in for a sublayer
        def forward(self, *args, **kwargs):
            return args[0]

    stand_in.model.layers[1].mlp = Silent()
    assert "other modules" in why_not_lean(stand_in)

    class Quantized(nn.Linear):           # a quantized or patched linear layer
        pass

    patched = copy.deepcopy(tiny_model("llama"))
    patched.model.layers[0].self_attn.q_proj = Quantized(32, 32, bias=False)
    assert "linear layers of class Quantized" in why_not_lean(patched)
    with pytest.raises(ValueError, match="cannot run"):
        LeanForward(stand_in)
    # draft_model falls back to the model's own forward there, and where draft.lean_forward is false
    assert DraftModel(stand_in).lean is None
    assert DraftModel(tiny_model("llama"), lean_forward=False).lean is None
    assert DraftModel(tiny_model("llama")).lean is not None


@pytest.mark.parametrize("arch", LEAN_ARCHS)
@pytest.mark.parametrize("branching", [None, [3, 2, 1]], ids=["chain", "tree"])
def test_draft_model_with_lean_forward_is_identical_to_greedy_and_never_calls_the_draft_module(arch, branching):
    target = tiny_model(arch, seed=0, sharpen=6.0)
    draft = noisy_copy(target, noise=0.2)
    calls = []
    draft.register_forward_hook(lambda *_: calls.append(1))
    prompt = [1, 5, 9, 14, 3, 7, 22, 40, 5, 9]
    strategy = DraftModel(draft, num_tokens=4, branching=branching)
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=40, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, prompt, 40, eos_token_id=None)
    assert sum(out.stats.accepted_lengths) > 0
    assert not calls       # every draft forward ran lean
