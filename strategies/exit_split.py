"""The target's decoder run in two parts over its one KV cache: layers < E on tokens (ending in the
exit states, which the target's final norm and lm_head turn into early-exit logits), then layers >= E
on exit states (LayerSkip's self-speculation with KV reuse).

Both parts are views of the target (strategies/layer_views.part_view): Hugging Face model objects that
run a slice of the target's own layer modules, so every mask, rotary embedding and position rule is
the model's own. A layer writes its KV at its own index (its attention module's layer_idx): the lower
part writes layers 0 .. E - 1 of the target's cache directly, the upper part goes through
`UpperCache`, which shows it layers E .. L - 1 as its own 0 .. L - E - 1, so the upper part's mask
and positions read its own layers' fill. `SplitTarget.check` proves on a probe, at bind, that the two
parts together give the target's own logits and the lower part's head the early-exit view's; an
architecture where they do not (an input scaling applied again to the exit states, a norm found
wrongly) is refused there.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache

from specdec.cache import new_cache
from specdec.errors import IncompatibleModelsError
from specdec.models import cache_kwargs

from .layer_views import decoder_layers, exit_view, num_layers, part_view


class UpperCache(Cache):
    """Layers first .. L - 1 of `cache` as a cache of their own: the upper part's layers write at
    their own layer_idx (first ..), read here as 0 ..; what the model asks of the cache (fill, mask
    sizes) is about those layers alone. The layers are the target cache's own objects: an update
    here is an update there."""

    def __init__(self, cache: Cache, first: int):
        super().__init__(layers=list(cache.layers[first:]))
        self.first = first

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return super().update(key_states, value_states, layer_idx - self.first, *args, **kwargs)


class _ZeroEmbedding(nn.Module):
    """An embedding of width `width` that adds nothing: the upper part's absolute position embedding
    (GPT-2's wpe), which the exit states already hold from the lower part."""

    def __init__(self, width: int, dtype: torch.dtype):
        super().__init__()
        self.width, self.dtype = width, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.width, dtype=self.dtype, device=ids.device)   # [..., width]


def final_norm(target, layers_path: str, setting: str = "early_exit.reuse_kv") -> tuple[str, nn.Module]:
    """(attribute name, module) of the target's final norm: the one module with parameters registered
    after the decoder's layer list on the same parent (Llama's `norm`, GPT-2's `ln_f`, GPT-NeoX's
    `final_layer_norm`). Refused, naming `setting` (the boolean setting that needs it), where there is
    not exactly one."""
    parent_path, _, layers_name = layers_path.rpartition(".")
    parent = target.get_submodule(parent_path)
    names = list(parent._modules)
    after = [name for name in names[names.index(layers_name) + 1:]
             if parent._modules[name] is not None and any(True for _ in parent._modules[name].parameters())]
    if len(after) != 1:
        raise IncompatibleModelsError(
            f"{setting}: the target ({type(target).__name__}) has {len(after)} modules with weights after its "
            f"decoder layers ({', '.join(after) or 'none'}), not one final norm; set {setting}=false")
    return after[0], parent._modules[after[0]]


class SplitTarget:
    """The target at exit layer E as two parts over one cache, and its early-exit head."""

    def __init__(self, target, exit_layer: int):
        self.target = target
        self.exit_layer = int(exit_layer)
        path = decoder_layers(target)
        norm_name, self.norm = final_norm(target, path)
        self.lm_head = target.get_output_embeddings()
        # the lower part: layers < E, no final norm, so its decoder's output is the exit states
        self.lower_model = exit_view(target, exit_layer).get_submodule(path.rpartition(".")[0])
        self.lower_model._modules[norm_name] = nn.Identity()
        # the upper part: layers >= E on exit states, then the target's final norm and lm_head
        self.upper = part_view(target, slice(exit_layer, num_layers(target)))
        upper_model = self.upper.get_submodule(path.rpartition(".")[0])
        embedding = target.get_input_embeddings()
        names = list(upper_model._modules)
        for name in names[: names.index(path.rpartition(".")[2])]:
            module = upper_model._modules[name]
            if isinstance(module, nn.Embedding) and module is not embedding:
                upper_model._modules[name] = _ZeroEmbedding(module.embedding_dim, module.weight.dtype)

    def lower(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """[n, H] exit states of `input_ids` [1, n] at `positions` [1, n], after the cache's fill of
        layers < E, whose KV for them it writes."""
        out = self.lower_model(input_ids=input_ids, position_ids=positions, **cache_kwargs(self.lower_model, cache),
                               use_cache=True)
        return out.last_hidden_state[0]

    def head(self, states: torch.Tensor) -> torch.Tensor:
        """[n, V] the early-exit logits of exit states [n, H]: the target's final norm, then its lm_head."""
        return self.lm_head(self.norm(states))

    def upper_logits(self, states: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """[n, V] the target's logits for exit states [n, H] at `positions` [1, n], after the fill of
        the cache's layers >= E, whose KV for them it writes."""
        upper_cache = UpperCache(cache, self.exit_layer)
        out = self.upper(inputs_embeds=states[None], position_ids=positions, **cache_kwargs(self.upper, upper_cache),
                         use_cache=True)
        return out.logits[0]

    @torch.inference_mode()
    def check(self) -> None:
        """A probe: exit states fed to the lower part in two pieces, then the upper part over all of
        them, give the target's own logits of the same tokens; the head of the exit states gives the
        early-exit view's. Refused (IncompatibleModelsError) otherwise."""
        device = next(self.target.parameters()).device
        ids = (torch.arange(6, device=device) * 7 + 3)[None] % self.lm_head.weight.shape[0]       # [1, 6]
        positions = torch.arange(6, device=device)[None]
        expected = self.target(input_ids=ids, position_ids=positions,
                               **cache_kwargs(self.target, new_cache(self.target, "target")), use_cache=True).logits[0]
        cache = new_cache(self.target, "target")
        states = torch.cat([self.lower(ids[:, :4], positions[:, :4], cache),
                            self.lower(ids[:, 4:], positions[:, 4:], cache)])                    # [6, H]
        drafted = exit_view(self.target, self.exit_layer)(input_ids=ids, position_ids=positions).logits[0]
        tolerance = 1e-4 if expected.dtype == torch.float32 else 3e-2
        for what, got, wanted in (("the two parts' logits", self.upper_logits(states, positions, cache), expected),
                                  ("the exit states' head", self.head(states), drafted)):
            error = float((got.float() - wanted.float()).abs().max() / wanted.float().abs().max().clamp_min(1.0))
            if not error <= tolerance:
                raise IncompatibleModelsError(
                    f"early_exit.reuse_kv: on the target ({type(self.target).__name__}, model_type "
                    f"{self.target.config.model_type!r}) {what} differ from the whole model's (relative error "
                    f"{error:.1e}): its layers cannot be resumed from exit states; set early_exit.reuse_kv=false")
