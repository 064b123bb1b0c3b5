"""KV cache for speculative decoding: a preallocated buffer per layer (no re-concatenation of
the whole cache on every forward), and the commit of the accepted rows of the last forward."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .models import check_cacheable


class BufferedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a buffer that grows by doubling: an update writes
    the new entries in place and `keys`/`values` are views of the filled part. Dropping entries
    (crop) only moves the fill mark."""

    def __init__(self, capacity: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self.length = 0
        self.key_buffer = self.value_buffer = None     # [B, heads, capacity, head_dim]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        if self.key_buffer is not None and needed <= self.key_buffer.shape[2]:
            return
        capacity = max(self.capacity, needed * 2 if self.key_buffer is not None else needed + self.capacity)
        batch, heads = key_states.shape[:2]
        key_buffer = key_states.new_empty(batch, heads, capacity, key_states.shape[-1])
        value_buffer = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if self.length:
            key_buffer[:, :, : self.length] = self.key_buffer[:, :, : self.length]
            value_buffer[:, :, : self.length] = self.value_buffer[:, :, : self.length]
        self.key_buffer, self.value_buffer = key_buffer, value_buffer

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


def new_cache(model, role: str = "draft") -> DynamicCache:
    """A DynamicCache for `model` with a BufferedLayer for every layer. Sliding-window layers keep
    their full KV too (Hugging Face's sliding layers drop old entries and then refuse to roll
    back): the window is applied by the attention mask instead, which Hugging Face builds from
    positions for a chain and `tree_attention_mask` builds for a tree. Layer kinds whose KV cannot
    be committed this way (chunked, linear attention, ...) are refused with a clear error."""
    layers = len(check_cacheable(model, role))
    cache = DynamicCache(config=model.config)
    cache.layers = [BufferedLayer() for _ in range(layers)]
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


@torch.inference_mode()
def commit_rows(cache: DynamicCache, prefix_len: int, kept_rows: Sequence[int]) -> None:
    """The cache holds prefix_len committed entries followed by the rows of the last forward.
    Keep the rows `kept_rows` (indices into that forward, ascending) in contiguous slots right
    after the prefix and drop everything else. A leading run 0..k-1 is a crop."""
    kept_rows = list(kept_rows)
    new_len = prefix_len + len(kept_rows)
    if kept_rows != list(range(len(kept_rows))):
        index = torch.tensor([prefix_len + r for r in kept_rows], dtype=torch.long)
        for layer in cache.layers:
            idx = index.to(layer.keys.device)
            # [B, heads, len, dim]: move the kept rows down into the slots after the prefix
            layer.keys[:, :, prefix_len:new_len] = layer.keys.index_select(2, idx)
            layer.values[:, :, prefix_len:new_len] = layer.values.index_select(2, idx)
    remove = cache.get_seq_length() - new_len
    if remove > 0:
        cache.crop(-remove)   # a negative count removes that many entries (transformers 4.x and 5.x)
