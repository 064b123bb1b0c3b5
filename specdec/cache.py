"""KV cache for speculative decoding: a preallocated buffer per layer (no re-concatenation of
the whole cache on every forward), and the commit of the accepted rows of the last forward.

Keys and values of a layer share one buffer [2, B, heads, capacity, head_dim], so a commit moves
both with one gather and one copy per layer, its index built once on the device per commit. Where
keys are wider than values (multi-head latent attention: DeepSeek-V2/V3, MiniCPM3, GLM-4-MoE-Lite),
head_dim is the wider of the two and the narrower one is a view of its first columns."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

try:                          # transformers releases with linear-attention models (Qwen3-Next)
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
except ImportError:
    LinearAttentionCacheLayerMixin = ()

from .models import RECURRENT_LAYER_TYPES, check_cacheable

SPARE_SLOTS = 256        # room a BufferedLayer leaves after its first update when no capacity was given


def _kv_buffer(key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> torch.Tensor:
    """[2, B, heads, capacity, max(key dim, value dim)]: keys at [0], values at [1] (see _kv_views)."""
    if key_states.shape[:2] != value_states.shape[:2]:
        raise NotImplementedError(f"keys {tuple(key_states.shape)} and values {tuple(value_states.shape)} differ in "
                                  f"batch or heads: specdec's KV buffer holds both in one tensor")
    batch, heads = key_states.shape[:2]
    return key_states.new_empty(2, batch, heads, capacity, max(key_states.shape[-1], value_states.shape[-1]))


def _kv_views(kv_buffer: torch.Tensor, key_dim: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value buffers [B, heads, capacity, dim] inside a kv_buffer: views, the narrower
    one its first columns (the padding columns are moved by commits, never read)."""
    return kv_buffer[0, ..., :key_dim], kv_buffer[1, ..., :value_dim]


def _move_rows(kv_buffer: torch.Tensor, slots: torch.Tensor, prefix_len: int) -> None:
    """Copy the slots `slots` [K] of a [2, B, heads, capacity, dim] buffer to prefix_len .. prefix_len + K:
    one gather and one copy for keys and values together."""
    kv_buffer[:, :, :, prefix_len: prefix_len + len(slots)] = kv_buffer.index_select(3, slots)


class BufferedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in one preallocated buffer: an update writes the new
    entries in place and `keys`/`values` are views of the filled part. Dropping entries (crop)
    only moves the fill mark. Given a `capacity` (prompt + new tokens + the largest forward), the
    buffer is allocated once at that size; without one, or when an update outgrows it, the buffer
    grows by doubling (a reallocation and a copy: the fallback, counted in `reallocations`)."""

    def __init__(self, capacity: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self.length = 0
        self.reallocations = 0
        self.kv_buffer = None                            # [2, B, heads, allocated, head_dim]
        self.key_buffer = self.value_buffer = None       # views: kv_buffer[0], kv_buffer[1]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        if self.kv_buffer is not None and needed <= self.kv_buffer.shape[3]:
            return
        if self.kv_buffer is not None:       # outgrown: double
            size = needed * 2
            self.reallocations += 1
        else:
            size = max(needed, self.capacity) if self.capacity else needed + SPARE_SLOTS
        kv_buffer = _kv_buffer(key_states, value_states, size)
        if self.length:
            kv_buffer[:, :, :, : self.length] = self.kv_buffer[:, :, :, : self.length]
        self.kv_buffer = kv_buffer
        self.key_buffer, self.value_buffer = _kv_views(kv_buffer, key_states.shape[-1], value_states.shape[-1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._reserve(key_states, value_states, self.length + new)
        self.key_buffer[:, :, self.length: self.length + new] = key_states
        self.value_buffer[:, :, self.length: self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def overwrite_from(self, start: int, key_states: torch.Tensor, value_states: torch.Tensor):
        """Drop the entries from `start` on and write the new ones there (at the length, where it is
        shorter): keep(start, None, start) then update, without keep's views of a length update moves
        again at once."""
        self.length = min(self.length, start)
        return self.update(key_states, value_states)

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:      # transformers 4.x meaning: the length to keep
            tokens_to_remove = tokens_to_remove - self.length
        if tokens_to_remove < 0 and self.key_buffer is not None:
            self.length = max(0, self.length + tokens_to_remove)
            self._views()

    def reset(self) -> None:
        self.length = 0
        if self.key_buffer is not None:
            self._views()

    def keep(self, prefix_len: int, slots: torch.Tensor | None, new_len: int) -> None:
        """Commit: move the slots `slots` [K] (None: they are in place already) right after the
        prefix, and end the cache there."""
        if slots is not None:
            _move_rows(self.kv_buffer, slots, prefix_len)
        self.length = min(self.length, new_len)
        if self.key_buffer is not None:
            self._views()


class SlotLayer(StaticLayer):
    """A fixed-size layer for the compiled forward (Hugging Face's StaticLayer, whose `keys` /
    `values` are the whole [B, heads, capacity, dim] buffers the attention reads, empty slots
    hidden by the mask): an update writes its R rows at slots write_start .. write_start + R,
    `write_start` being one 0-d device tensor shared by all layers and set once per forward, so a
    rejected draft is overwritten in place and never needs a crop."""

    def __init__(self, capacity: int, write_start: torch.Tensor):
        super().__init__(max_cache_len=capacity)
        self.write_start = write_start                      # [] long, on the model's device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        self.kv_buffer = _kv_buffer(key_states, value_states, self.max_cache_len).zero_()
        self.keys, self.values = _kv_views(self.kv_buffer, self.k_head_dim, self.v_head_dim)
        if not torch.compiler.is_compiling():     # fixed addresses: no recompiles, CUDA graphs allowed
            for tensor in (self.kv_buffer, self.keys, self.values):
                torch._dynamo.mark_static_address(tensor)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = torch.arange(key_states.shape[-2], device=self.device) + self.write_start    # [R]
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        raise NotImplementedError("a SlotLayer does not know its length (the verifier does): pass position_ids "
                                  "and an attention mask to the model")

    def keep(self, prefix_len: int, slots: torch.Tensor | None, new_len: int) -> None:
        if slots is not None:
            _move_rows(self.kv_buffer, slots, prefix_len)


def new_cache(model, role: str = "draft", capacity: int | None = None, recurrent: bool = False) -> DynamicCache:
    """A DynamicCache for `model` with a BufferedLayer for every layer, each allocated once for
    `capacity` entries when given (else grown as needed). Sliding-window layers keep their full
    KV too (Hugging Face's sliding layers drop old entries and then refuse to roll back): the
    window is applied by the attention mask instead, which Hugging Face builds from positions for
    a chain and `tree_attention_mask` builds for a tree. Layer kinds whose KV cannot be committed
    this way (chunked, linear attention, ...) are refused with a clear error; with `recurrent`
    (the verifier of a target that has them), linear-attention layers keep Hugging Face's own
    layer, whose state the verifier rolls back (commit_rows leaves it alone)."""
    types = check_cacheable(model, role, recurrent=recurrent)
    cache = DynamicCache(config=model.config)
    own = cache.layers if len(cache.layers) == len(types) else [None] * len(types)
    cache.layers = [layer if isinstance(layer, LinearAttentionCacheLayerMixin) else BufferedLayer(capacity)
                    for layer in own]
    if sum(isinstance(layer, BufferedLayer) for layer in cache.layers) != sum(t not in RECURRENT_LAYER_TYPES for t in types):
        raise NotImplementedError(f"Hugging Face's cache for {type(model).__name__} does not put a linear-attention "
                                  f"layer where its config says one is ({types}): specdec cannot verify on it")
    return cache


def new_static_cache(model, capacity: int, role: str = "target") -> Cache:
    """A Cache of SlotLayers of `capacity` slots for the compiled forward; `cache.write_start`
    [] is where the next forward writes."""
    layers = len(check_cacheable(model, role))
    write_start = torch.zeros((), dtype=torch.long, device=model.device)
    torch._dynamo.mark_static_address(write_start)
    cache = Cache(layers=[SlotLayer(capacity, write_start) for _ in range(layers)])
    cache.write_start = write_start
    return cache


def _device(cache: Cache) -> torch.device:
    for layer in cache.layers:
        if getattr(layer, "kv_buffer", None) is not None:
            return layer.kv_buffer.device
    return torch.device("cpu")


@torch.inference_mode()
def commit_rows(cache: Cache, prefix_len: int, kept_rows: Sequence[int],
                kept_on_device: torch.Tensor | None = None) -> None:
    """The cache holds prefix_len committed entries followed by the rows of the last forward.
    Keep the rows `kept_rows` (indices into that forward, ascending) in contiguous slots right
    after the prefix and drop everything else. A leading run 0..k-1 is a crop (for a SlotLayer:
    nothing to do); anything else moves the kept rows with one index and one gather + one copy
    per layer. The index comes from `kept_on_device` (the same rows [K], on the device: nothing
    copied from the host) when given, else from kept_rows (one copy)."""
    kept_rows = list(kept_rows)
    new_len = prefix_len + len(kept_rows)
    slots = None
    if kept_rows != list(range(len(kept_rows))):
        if kept_on_device is not None:
            slots = kept_on_device.to(_device(cache)) + prefix_len                                           # [K]
        else:
            slots = torch.tensor(kept_rows, dtype=torch.long).add_(prefix_len).to(_device(cache), non_blocking=True)  # [K]
    for layer in cache.layers:
        if not isinstance(layer, LinearAttentionCacheLayerMixin):    # a recurrent state: the verifier's (rollback)
            layer.keep(prefix_len, slots, new_len)
