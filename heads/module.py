"""Medusa-style heads: K small heads on the target's last hidden state (post final norm).

Head k (k = 1..K) guesses the token k + 1 positions after the hidden state's position (the
target's own lm_head guesses the token right after it). Each head is a few residual blocks
`x + SiLU(W x)` with W = 0 at start (a fresh head is the identity), then either the target's
own frozen lm_head (shared, kept out of the heads' parameters) or a projection of its own.

Token-conditioned heads (layout.token_conditioned) also see the token right before the one they
guess: head k, guessing token t + k + 1, reads the embedding of token t + k (for head 1 the
pending token, known when the heads run; for head k > 1 the drafted parent node in the tree).
Its input is `hidden + P_k · embed(that token)`, with the target's own frozen input embedding
and P_k = 0 at start (so a fresh head is still the identity of the hidden state). Plain Medusa
heads must guess every earlier token implicitly, and cannot know a sampled one at all; a tree of
these heads' guesses is expanded depth by depth (see strategies/medusa.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from specdec.strategies.draft_vocab import project

# the heads' own file format (written and read by heads/io.py): a folder with these two files
WEIGHTS_FILE = "heads.safetensors"
CONFIG_FILE = "heads.json"


@dataclass(frozen=True)
class HeadsLayout:
    num_heads: int          # K
    num_layers: int         # residual blocks per head
    hidden_size: int        # H: the target's hidden size
    vocab_size: int         # V: the width of the target's logits
    own_lm_head: bool = False   # True: each head has its own [V, H] projection
    token_conditioned: bool = False   # True: head k also sees the token before the one it guesses

    def as_dict(self) -> dict:
        return asdict(self)


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero at start: the identity until trained."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., H] -> [..., H]
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, layout: HeadsLayout):
        super().__init__()
        self.layout = layout
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResidualBlock(layout.hidden_size) for _ in range(layout.num_layers)])
            for _ in range(layout.num_heads))
        self.lm_heads = (nn.ModuleList(nn.Linear(layout.hidden_size, layout.vocab_size, bias=False)
                                       for _ in range(layout.num_heads))
                         if layout.own_lm_head else None)
        self.token_projs = (nn.ModuleList(nn.Linear(layout.hidden_size, layout.hidden_size, bias=False)
                                          for _ in range(layout.num_heads))
                            if layout.token_conditioned else None)
        for proj in self.token_projs or ():
            nn.init.zeros_(proj.weight)
        self._shared_lm_head: list[nn.Module] = []     # the target's lm_head, outside state_dict()
        self._shared_embedding: list[nn.Module] = []   # the target's input embedding, likewise
        self.vocab_subset = None     # draft_vocab's VocabSubset (strategies/draft_vocab.py): the projections read
        #                              only its kept tokens' rows and give -inf elsewhere; None: every token

    @property
    def num_heads(self) -> int:
        return self.layout.num_heads

    def attach_lm_head(self, lm_head: nn.Module) -> None:
        """Share the target's (frozen) output layer; it is not saved with the heads."""
        self._shared_lm_head[:] = [lm_head]

    def attach_embedding(self, embedding: nn.Module) -> None:
        """Share the target's (frozen) input embedding, for token-conditioned heads; not saved."""
        self._shared_embedding[:] = [embedding]

    def init_own_lm_heads(self, lm_head_weight: torch.Tensor) -> None:
        """Start each own projection as a copy of the target's lm_head weights [V, H]."""
        if self.lm_heads is None:
            return
        with torch.no_grad():
            for head in self.lm_heads:
                head.weight.copy_(lm_head_weight)

    def _check_token_inputs(self, prev_ids) -> None:
        if prev_ids is None:
            raise ValueError("token-conditioned heads need prev_ids: for head k, the token right before the one "
                             "it guesses (the pending token for head 1)")
        if not self._shared_embedding:
            raise RuntimeError("token-conditioned heads use the target's input embedding: call "
                               "attach_embedding(target's get_input_embeddings()) first (Medusa.bind and "
                               "load_heads do)")

    def head_features(self, k: int, hidden: torch.Tensor, prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Head k (1..K): [..., H] (and prev_ids [...]: the token before the one head k guesses) -> [..., H]."""
        x = hidden
        if self.token_projs is not None:
            self._check_token_inputs(prev_ids)
            x = hidden + self.token_projs[k - 1](self._shared_embedding[0](prev_ids).to(hidden.dtype))
        return self.blocks[k - 1](x)

    def head_logits(self, k: int, hidden: torch.Tensor, prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Head k (1..K) alone: [..., H] (and prev_ids [...]) -> [..., V] logits for token +k+1."""
        features = self.head_features(k, hidden, prev_ids)
        return project(self.vocab_subset, self.lm_heads[k - 1] if self.lm_heads is not None else self._lm_head(),
                       features)

    def features(self, hidden: torch.Tensor, prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[..., H] (and prev_ids [..., K], column k - 1 for head k) -> [..., K, H]."""
        return torch.stack([self.head_features(k, hidden, None if prev_ids is None else prev_ids[..., k - 1])
                            for k in range(1, self.num_heads + 1)], dim=-2)

    def _lm_head(self) -> nn.Module:
        if not self._shared_lm_head:
            raise RuntimeError("these heads use the target's lm_head: call attach_lm_head(target's "
                               "get_output_embeddings()) first (Medusa.bind and load_heads do)")
        return self._shared_lm_head[0]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """[..., K, H] per-head features (column k - 1 from head k) -> [..., K, V] logits in ONE
        matmul: the shared lm_head over all heads' rows at once, or the heads' own projections as
        one batched matmul over a [K, V, H] stack of their weights."""
        if self.lm_heads is None:
            return project(self.vocab_subset, self._lm_head(), features)
        if self.vocab_subset is not None:      # each head's own kept rows: K products, as K head calls would be
            return torch.stack([project(self.vocab_subset, head, features[..., k, :])
                                for k, head in enumerate(self.lm_heads)], dim=-2)
        return torch.einsum("...kh,kvh->...kv", features, self._own_weights())

    def _own_weights(self) -> torch.Tensor:
        """[K, V, H] the own projections stacked. Without grad the stack is kept and rebuilt only
        when a weight changed (its in-place version counter moved); with grad it is stacked anew,
        so training sees the live weights."""
        weights = [head.weight for head in self.lm_heads]
        if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
            return torch.stack(weights)
        key = tuple((w.data_ptr(), w._version, w.device, w.dtype) for w in weights)
        if getattr(self, "_stacked_key", None) != key:
            self._stacked = torch.stack([w.detach() for w in weights])
            self._stacked_key = key
        return self._stacked

    def forward(self, hidden: torch.Tensor, prev_ids: torch.Tensor | None = None, head: int | None = None) -> torch.Tensor:
        """[..., H] last hidden states (and, for token-conditioned heads, prev_ids [..., K]: column k - 1
        is the token before the one head k guesses) -> [..., K, V]; [..., k-1, :] guesses token +k+1;
        the K heads' vocabulary projections are one matmul (`project`).
        With head=k: head k alone, prev_ids [...] -> [..., V] (what head_logits gives, as a module call)."""
        if head is not None:
            return self.head_logits(head, hidden, prev_ids)
        return self.project(self.features(hidden, prev_ids))                 # [..., K, V]


def bind_heads(heads: MedusaHeads, target) -> MedusaHeads:
    """Move the heads to the target's device and dtype and share its lm_head (and its input
    embedding, which token-conditioned heads read)."""
    heads.to(device=target.device, dtype=target.dtype)
    heads.attach_lm_head(target.get_output_embeddings())
    heads.attach_embedding(target.get_input_embeddings())
    return heads
