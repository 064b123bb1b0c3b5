"""The verifier: one forward of the unmodified target over [pending token] + tree, on top of its
KV cache, then the commit of the accepted path. It never knows which strategy proposed the tree."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .cache import commit_rows, new_cache
from .models import AttentionLayout, attention_layout
from .tree import CandidateTree, tree_attention_mask, tree_position_ids, with_pending_root


@dataclass
class TreeOutput:
    logits: torch.Tensor               # [1 + N, V]: row 0 = pending token, row i + 1 = tree node i
    hidden: torch.Tensor | None        # [1 + N, F] target features (see `features`), when asked


def features(hidden_states, layers: Sequence[int]) -> torch.Tensor:
    """[L, F] target features of one sequence: the hidden states of `layers` (indices into HF's
    `hidden_states` tuple: 0 = embeddings, -1 = last layer post final norm) side by side.
    F = len(layers) * H; layers (-1,) is what the lm_head reads."""
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)


def tree_masks(layout: AttentionLayout, parents: Sequence[int], prefix_len: int, dtype: torch.dtype,
               device: torch.device):
    """The attention mask(s) of a tree forward: one [1, 1, N, prefix_len + N] mask when every layer
    attends alike, else {layer type: mask} (Hugging Face's per-type mask mapping), each layer type
    with its own sliding window."""
    by_window = {window: tree_attention_mask(parents, prefix_len, dtype, device, window)
                 for window in set(layout.windows.values())}
    if not layout.by_type:
        return next(iter(by_window.values()))
    return {layer_type: by_window[window] for layer_type, window in layout.windows.items()}


class Verifier:
    def __init__(self, model):
        self.model = model
        self.layout = attention_layout(model)     # refuses attention it cannot verify trees on
        self.cache = None
        self.prefix_len = 0            # committed tokens whose KV is in the cache (all but the pending one)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int], feature_layers: Sequence[int] | None = None) -> torch.Tensor | None:
        """Start a new sequence: put the KV entries of `token_ids` (all committed tokens but the
        pending one) in a fresh cache. With feature_layers, return their features [len, F]."""
        self.cache = new_cache(self.model, "target")
        self.prefix_len = 0
        if not len(token_ids):
            return None
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=feature_layers is not None)
        self.prefix_len = len(token_ids)
        return features(out.hidden_states, feature_layers) if feature_layers is not None else None

    @torch.inference_mode()
    def forward(self, pending_token: int, tree: CandidateTree,
                feature_layers: Sequence[int] | None = None) -> TreeOutput:
        """Target outputs for the pending token and every tree node, in one forward (and their
        features, with feature_layers)."""
        pending = torch.tensor([pending_token], dtype=torch.long, device=self.device)
        input_ids = torch.cat([pending, tree.tokens.to(self.device)])[None]       # [1, 1 + N]
        if tree.is_chain:   # a chain is causal: the model builds its own mask(s), windows included
            mask, positions = None, None
        else:
            parents = with_pending_root(tree.parents)
            mask = tree_masks(self.layout, parents, self.prefix_len, self.model.dtype, self.device)
            positions = tree_position_ids(parents, self.prefix_len, self.device)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True,
                         output_hidden_states=feature_layers is not None)
        hidden = features(out.hidden_states, feature_layers) if feature_layers is not None else None
        return TreeOutput(out.logits[0], hidden)

    def commit(self, kept_rows: Sequence[int]) -> None:
        """Keep the rows `kept_rows` of the last forward (0 = pending token, then the accepted
        nodes' rows, ascending) after the prefix. The last kept row's token is the new last
        committed one before the next pending token."""
        commit_rows(self.cache, self.prefix_len, kept_rows)
        self.prefix_len += len(kept_rows)
