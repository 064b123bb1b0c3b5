"""Acceptance: which path of a CandidateTree the target keeps, and the token that follows it.

Pure functions of the tree, the target's per-node outputs and (when sampling) a random source.
Row 0 of the target outputs belongs to the pending token, row i + 1 to tree node i: row r holds
the target's distribution for the children of that row's node.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import WITHOUT_REPLACEMENT, CandidateTree


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]   # tree node indices of the accepted path, root first
    next_token: int             # the target's own token after that path (correction or bonus)

    @property
    def last_row(self) -> int:
        """Row of the target outputs that produced next_token (0 = pending token)."""
        return self.accepted[-1] + 1 if self.accepted else 0


def accept_greedy(tree: CandidateTree, target_argmax: list[int], tree_tokens: list[int] | None = None) -> Verdict:
    """Walk from the root to the child equal to the target's argmax; the first miss yields the argmax.

    target_argmax: [1 + N] argmax token of each row."""
    tokens = tree.tokens.tolist() if tree_tokens is None else tree_tokens
    accepted: list[int] = []
    node = -1
    while True:
        want = target_argmax[node + 1]
        for child in tree.children(node):
            if tokens[child] == want:
                accepted.append(child)
                node = child
                break
        else:
            return Verdict(tuple(accepted), want)


def _normalized(residual: torch.Tensor) -> torch.Tensor | None:
    total = residual.sum()
    if not total > 0:
        return None
    return residual / total


def accept_sampling(tree: CandidateTree, target_probs: torch.Tensor, rng, tree_tokens: list[int] | None = None) -> Verdict:
    """Recursive rejection sampling over siblings; the kept path has the target's law.

    target_probs: [1 + N, V] fp32 warped target distributions per row.
    At each node keep a residual r = target distribution there; try the children in drafted
    order, accept child x with probability min(1, r(x) / q(x)); on rejection r <- norm(max(0, r - q)).
    q is the child's draft distribution (None: a point mass on x). Siblings drawn without
    replacement see q with the earlier siblings' tokens removed. If every child is rejected the
    token is drawn from r; below an accepted leaf it is drawn from the target there (bonus)."""
    tokens = tree.tokens.tolist() if tree_tokens is None else tree_tokens
    draft_probs = tree.draft_probs
    without_replacement = tree.siblings == WITHOUT_REPLACEMENT
    accepted: list[int] = []
    node = -1
    while True:
        kids = tree.children(node)
        residual = target_probs[node + 1]                          # [V]
        if not kids:
            return Verdict(tuple(accepted), rng.categorical(residual))
        tried: list[int] = []
        for child in kids:
            token = tokens[child]
            if draft_probs is None:                                 # point mass on `token`
                accept_prob = residual[token]
            else:
                draft = draft_probs[child]                          # [V]
                if without_replacement and tried:
                    draft = draft.clone()
                    draft[tried] = 0
                    draft = draft / draft.sum()
                accept_prob = torch.clamp(residual[token] / draft[token], max=1.0)
            if rng.bernoulli(accept_prob):
                accepted.append(child)
                node = child
                break
            if draft_probs is None:
                rejected = residual.clone()
                rejected[token] = 0
            else:
                rejected = torch.clamp(residual - draft, min=0)
            # A zero residual can only follow a rejection of probability zero (r == q):
            # keep r then, which has the same law and never divides by zero.
            renormalized = _normalized(rejected)
            if renormalized is not None:
                residual = renormalized
            tried.append(token)
        else:
            return Verdict(tuple(accepted), rng.categorical(residual))
