"""A small draft model's forward without Hugging Face's per-call machinery.

A draft model is called once per drafted token. On a 2-layer, 1.7M-parameter draft its Hugging Face
forward costs 1.2-2 ms on a CPU, of which its matrix products are about 0.25 ms: the rest is the
fixed cost of the call (mask and output building, keyword checks, deprecation wrappers, module
hooks, per layer and per call). LeanForward runs the same modules' weights with the same math
(RMSNorm in float32, rotary embeddings from the model's own rotary module, so its rope scaling too,
attention with the same mask) and the same KV cache, as plain tensor code; its attention kernel is
PyTorch's scaled_dot_product_attention whatever `attn_implementation` the model was loaded with, and
hooks registered on the model's modules do not run. It is used only where every module is one of
the classes it knows (Llama, Qwen2 or Mistral decoder layers, full attention everywhere); anything
else (another architecture, sliding windows, a layer view with stand-in sublayers such as
layer_skip's, quantized linear layers) keeps Hugging Face's forward. A draft only guesses, so an
approximation would cost acceptance, never correctness; the tests check it agrees with Hugging
Face's forward all the same (tests/test_lean_forward.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import decoder_layer_types

from .draft_vocab import VocabSubset

_KNOWN = {   # model_type -> (causal LM, decoder layer, attention, MLP, RMSNorm) class names of transformers' modeling file
    "llama": ("LlamaForCausalLM", "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
    "mistral": ("MistralForCausalLM", "MistralDecoderLayer", "MistralAttention", "MistralMLP", "MistralRMSNorm"),
}


def why_not_lean(model) -> str | None:
    """None when LeanForward computes what `model`'s own forward does (up to the attention kernel), else why
    not (for logs and tests)."""
    config = getattr(model, "config", None)
    names = _KNOWN.get(getattr(config, "model_type", None))
    if names is None:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {sorted(_KNOWN)}"
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or any(not hasattr(inner, name) for name in needed) or model.get_output_embeddings() is None:
        return "not a decoder with embed_tokens, layers, norm, rotary_emb and an lm_head"
    kinds = set(decoder_layer_types(model)[0])     # Hugging Face's own reading: sliding windows, mixed layers
    if kinds != {"full_attention"}:
        return f"layers that do not all attend fully ({', '.join(sorted(kinds))})"
    model_cls, layer_cls, attn_cls, mlp_cls, norm_cls = names
    if type(model).__name__ != model_cls:       # a subclass may have a forward of its own
        return f"a model of class {type(model).__name__}, not {model_cls}"
    if len(inner.layers) != config.num_hidden_layers:     # the model's forward runs the first num_hidden_layers
        return f"{len(inner.layers)} layers against num_hidden_layers {config.num_hidden_layers}"
    for position, layer in enumerate(inner.layers):
        found = (type(layer).__name__, type(getattr(layer, "self_attn", None)).__name__,
                 type(getattr(layer, "mlp", None)).__name__, type(getattr(layer, "input_layernorm", None)).__name__,
                 type(getattr(layer, "post_attention_layernorm", None)).__name__)
        if found != (layer_cls, attn_cls, mlp_cls, norm_cls, norm_cls):
            return f"a layer of other modules ({', '.join(found)})"
        if not all(hasattr(layer.self_attn, name) for name in ("head_dim", "scaling", "layer_idx")):
            return "an attention module without head_dim, scaling and layer_idx (an older transformers)"
        if layer.self_attn.layer_idx != position:   # the cache slot the model's forward writes
            return f"layer {position} writes the cache of layer {layer.self_attn.layer_idx}"
        linears = [getattr(layer.self_attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
            getattr(layer.mlp, name) for name in ("gate_proj", "up_proj", "down_proj")]
        odd = [type(linear).__name__ for linear in linears if type(linear) is not nn.Linear]
        if odd:      # a quantized or patched linear layer: its weight is not what F.linear takes
            return f"linear layers of class {odd[0]}"
    if type(inner.norm).__name__ != norm_cls:
        return f"a final norm of class {type(inner.norm).__name__}"
    if type(model.get_output_embeddings()) is not nn.Linear:
        return f"an lm_head of class {type(model.get_output_embeddings()).__name__}"
    if any(hasattr(module, "_hf_hook") for module in model.modules()):
        return "accelerate hooks (offloaded or dispatched weights), which only the model's own forward runs"
    return None


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm, as its forward computes it (float32 statistics, weight in the input's dtype)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings as the modeling files apply them: x [1, n, L, d], cos and sin [1, 1, L, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LeanForward(nn.Module):
    """forward(input_ids [1, L], mask, positions [1, L] | None, cache, last_only) -> logits [L or 1, V],
    the model's own logits for those rows, writing their keys and values into `cache` (a DynamicCache,
    as the model's forward would). `mask`: None (the rows continue the cache as a chain) or one
    [1, 1, L, K] mask (additive or bool) over the cache's K = past + L slots.

    A module of its own (holding none of the model's: they stay the model's children alone), so that a
    forward hook sees its calls as it would the model's (the bench's forward meter: drafting modules)."""

    def __init__(self, model, vocab: VocabSubset | None = None):
        reason = why_not_lean(model)
        if reason is not None:
            raise ValueError(f"LeanForward cannot run this model: {reason}")
        super().__init__()
        inner = model.model
        # a plain tuple: the model's modules are read at each call (bind moves them), not registered here
        self.parts = (inner.embed_tokens, inner.rotary_emb, inner.norm, model.get_output_embeddings(),
                      tuple(inner.layers))
        attn = inner.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.heads = model.config.num_attention_heads
        self.kv_heads = getattr(model.config, "num_key_value_heads", None) or self.heads
        self.groups = self.heads // self.kv_heads
        self.vocab = vocab                      # draft_vocab's kept tokens: the lm_head reads only their rows

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:     # [1, L, count * d] -> [1, count, L, d]
        return x.view(1, -1, count, self.head_dim).transpose(1, 2)

    def forward(self, input_ids: torch.Tensor, mask, positions: torch.Tensor | None, cache,
                last_only: bool = False) -> torch.Tensor:
        embed, rotary, final_norm, lm_head, layers = self.parts
        length = input_ids.shape[1]
        past = cache.get_seq_length()
        if positions is None:
            positions = torch.arange(past, past + length, device=input_ids.device)[None]          # [1, L]
        if mask is None and length > 1:   # a chain after the cache: row i sees the past and rows <= i
            keys = torch.arange(past + length, device=input_ids.device)
            mask = (keys[None, :] <= (past + torch.arange(length, device=input_ids.device))[:, None])[None, None]
        h = embed(input_ids)                                                                        # [1, L, H]
        cos, sin = rotary(h, positions)                                                        # [1, L, d]
        cos, sin = cos[:, None], sin[:, None]                                                       # [1, 1, L, d]
        for index, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, h)
            q = _rotate(self._heads(F.linear(x, attn.q_proj.weight, attn.q_proj.bias), self.heads), cos, sin)
            k = _rotate(self._heads(F.linear(x, attn.k_proj.weight, attn.k_proj.bias), self.kv_heads), cos, sin)
            v = self._heads(F.linear(x, attn.v_proj.weight, attn.v_proj.bias), self.kv_heads)
            k, v = cache.update(k, v, index)                                                        # [1, kv, K, d]
            if self.groups > 1:   # grouped-query attention: repeated as repeat_kv does (sdpa's enable_gqa
                #                   is torch >= 2.5, and this package takes torch >= 2.1)
                k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)     # [1, heads, L, d]
            out = out.transpose(1, 2).reshape(1, length, self.heads * self.head_dim)
            h = h + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(layer.post_attention_layernorm, h)
            x = mlp.act_fn(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(
                x, mlp.up_proj.weight, mlp.up_proj.bias)
            h = h + F.linear(x, mlp.down_proj.weight, mlp.down_proj.bias)
        if last_only:
            h = h[:, -1:]
        h = _rms_norm(final_norm, h)
        if self.vocab is not None:
            return self.vocab.linear(h, lm_head.weight, lm_head.bias)[0]   # [L or 1, V], -inf off the kept ids
        return F.linear(h, lm_head.weight, lm_head.bias)[0]            # [L or 1, V]
