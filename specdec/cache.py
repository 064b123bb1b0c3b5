"""KV-cache commit: keep the accepted rows of the last forward, drop the rest."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


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
