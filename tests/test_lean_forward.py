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


def _perturbed(model, seed: int = 7, scale: float = 0.1):
    """The model with every parameter moved by noise of a fixed size: a freshly built model's norm weights
    are ones and its biases zeros, so a forward that left them out would agree with one that does not."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


def _rope_scaled_llama():
    """A Llama whose rotary module scales positions (llama3 rope): LeanForward takes its cos / sin from it."""
    import transformers as T
    from conftest import tiny_config
    config = tiny_config("llama", hidden=64)
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    torch.manual_seed(5)
    return T.LlamaForCausalLM(config).eval()


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


@pytest.mark.parametrize("arch", LEAN_ARCHS + ["llama3-rope"])
def test_lean_logits_and_cache_are_the_models_own_on_every_kind_of_call(arch):
    model = _perturbed(_rope_scaled_llama() if arch == "llama3-rope" else tiny_model(arch, seed=3, hidden=64))
    if arch == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None      # Qwen2's q / k / v biases are run
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
    windowed.config.sliding_window = 16               # Mistral's forward reads its window from the config
    assert "sliding_attention" in why_not_lean(windowed)
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
    import transformers as T
    from conftest import tiny_config
    def windowed_qwen(full_layers):     # Qwen2's layers from max_window_layers on attend within the window
        return T.Qwen2ForCausalLM(T.Qwen2Config(**{**tiny_config("qwen2").to_dict(), "use_sliding_window": True,
                                                   "sliding_window": 16, "max_window_layers": full_layers,
                                                   "layer_types": None}))
    assert why_not_lean(windowed_qwen(0)).endswith("(sliding_attention)")
    assert "full_attention, sliding_attention" in why_not_lean(windowed_qwen(1))
    with pytest.raises(ValueError, match="cannot run"):
        LeanForward(stand_in)
    # draft_model falls back to the model's own forward there, and where draft.lean_forward is false
    assert DraftModel(stand_in).lean is None
    assert DraftModel(tiny_model("llama"), lean_forward=False).lean is None
    assert DraftModel(tiny_model("llama")).lean is not None


@pytest.mark.parametrize("arch", LEAN_ARCHS)
@pytest.mark.parametrize("branching", [None, [3, 2, 1]], ids=["chain", "tree"])
def test_draft_model_with_lean_forward_drafts_what_the_models_own_forward_drafts(arch, branching):
    """The whole call pattern (prompt catch-up, the step's catch-up of two, chains or tree levels after commits):
    the same tokens kept at every step as with the model's own forward, and greedy identity."""
    target = tiny_model(arch, seed=0, sharpen=6.0)
    draft = _perturbed(noisy_copy(target, noise=0.2), seed=3, scale=0.02)   # still agrees with the target often
    calls = []
    draft.register_forward_hook(lambda *_: calls.append(1))
    prompt = [1, 5, 9, 14, 3, 7, 22, 40, 5, 9]
    outs = {}
    for lean in (True, False):
        strategy = DraftModel(draft, num_tokens=4, branching=branching, lean_forward=lean)
        assert (strategy.lean is not None) == lean
        if lean:      # a drafting module, so the bench's forward meter times its calls as draft forwards
            assert strategy.lean in strategy.drafting_modules()
        calls.clear()
        outs[lean] = Speculator(target, None, strategy).generate(prompt, max_new_tokens=40, ignore_eos=True)
        assert bool(calls) != lean        # lean: every draft forward ran without the module's own forward
    assert outs[True].token_ids == hf_greedy(target, prompt, 40, eos_token_id=None)
    assert outs[True].stats.accepted_lengths == outs[False].stats.accepted_lengths
    assert sum(outs[True].stats.accepted_lengths) > 0


def test_draft_lean_forward_is_a_config_setting_and_the_target_views_keep_their_own_forward():
    from specdec.config import build_config, SpecConfig
    from specdec.strategies.draft_model import from_config
    from specdec.strategies.early_exit import EarlyExit
    from specdec.strategies.layer_skip import LayerSkip
    assert EarlyExit(exit_layer=1).lean_forward is False
    assert LayerSkip(attention=[0]).lean_forward is False
    cfg = SpecConfig()
    assert cfg.draft.lean_forward is True
    cfg.draft.lean_forward = False
    cfg.draft.path = "unused"
    import specdec.models as models
    draft = tiny_model("llama")
    original = models.load_model
    models.load_model = lambda *args, **kwargs: draft
    try:
        assert from_config(cfg, None, None, "cpu", torch.float32).lean is None
    finally:
        models.load_model = original
