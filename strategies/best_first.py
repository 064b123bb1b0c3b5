"""The best tree by cumulative draft log-probability, built depth by depth: medusa's dynamic trees
(plain and token-conditioned heads) and eagle's greedy (EAGLE-2) trees.

Each node gets the ranked best children its drafter offers (`children`); a node's score is the sum
of the log-probabilities along its path. The tree is the `max_nodes` best candidates. Depth by
depth, only nodes still among the max_nodes best candidates so far are expanded: candidates only
get worse deeper down (log-probabilities <= 0), so a node outside that set can never be chosen, nor
can its descendants - with `expand` unbounded the tree is the exact best one of the candidate tree.
Ranking by (score desc, depth asc) puts a parent before any child it ties with, so the chosen set
is closed under parents. One `children` call (one host read: the log-probabilities) per depth;
tokens stay on the device.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from specdec.strategies.lockstep import run_steps
from specdec.tree import CandidateTree

# children(depth, nodes, tokens, parents) -> (log-probs [n][k] on the host, tokens [n, k] on the device):
# the ranked best children, at `depth`, of the candidates `nodes` (indices into `parents`, the parent
# candidate of every candidate so far; depth 0: nodes [-1], the pending token, and tokens None; else
# tokens [n] their tokens on the device). A -inf log-prob ends a row (a filtered-out token: no child).
Children = Callable[[int, list, torch.Tensor | None, list], tuple[list[list[float]], torch.Tensor]]


def top_children(scores: torch.Tensor, k: int) -> tuple[list[list[float]], torch.Tensor]:
    """[n, V] scores -> (the k best children's log-probs [n][k] on the host, their tokens [n, k] on the
    device): the log-softmax of the scores, ranked. One host read."""
    top = scores.log_softmax(dim=-1).topk(min(k, scores.shape[-1]), dim=-1)
    return top.values.tolist(), top.indices


def best_first_tree(children: Children, depth_limit: int, max_nodes: int, device,
                    expand: int | None = None, stop_below: float = 0.0) -> CandidateTree:
    """The max_nodes best nodes, `depth_limit` levels at most. expand: nodes expanded per depth at most
    (the best of the newest level still among the best so far; None = all of them); stop_below:
    stop once the nodes to expand hold less path probability in all than this (0 = never)."""
    return run_steps(best_first_steps(depth_limit, max_nodes, device, expand, stop_below), children)


def best_first_steps(depth_limit: int, max_nodes: int, device, expand: int | None = None,
                     stop_below: float = 0.0):
    """best_first_tree as a step generator (strategies.lockstep): yields each `children` request
    (depth, nodes, tokens, parents), takes its answer (log-probs [n][k], tokens [n, k]) by send(),
    returns the tree."""
    scores: list[float] = []
    depths: list[int] = []
    parent_of: list[int] = []            # candidate index of the parent, -1 = the pending token
    # a candidate's token is at flat_at[i] of its depth's tokens [n * k] (level_tokens), read only for
    # the nodes expanded or chosen: an indexing op per candidate would cost a dispatch each, and an
    # index tensor a copy from the host
    flat_at: list[int] = []
    level_tokens: list[torch.Tensor] = []

    def best() -> list[int]:             # the max_nodes best candidates so far, best first
        return sorted(range(len(scores)), key=lambda i: (-scores[i], depths[i], i))[:max_nodes]

    frontier, frontier_tokens = [-1], None
    for depth in range(depth_limit):
        if depth:
            frontier = sorted([i for i in best() if depths[i] == depth - 1][:expand])
            if not frontier or sum(math.exp(scores[i]) for i in frontier) < stop_below:
                break
            frontier_tokens = torch.stack([level_tokens[-1][flat_at[i]] for i in frontier])     # [n]
        logprobs, tokens = yield depth, frontier, frontier_tokens, parent_of               # [n][k], [n, k]
        k = tokens.shape[-1]
        level_tokens.append(tokens.reshape(-1))                                            # [n * k]
        for row, (parent, row_logprobs) in enumerate(zip(frontier, logprobs)):
            base = scores[parent] if parent >= 0 else 0.0
            for rank, logprob in enumerate(row_logprobs):
                if logprob == float("-inf"):
                    break
                scores.append(base + logprob)
                depths.append(depth)
                parent_of.append(parent)
                flat_at.append(row * k + rank)
    chosen = sorted(best(), key=lambda i: (depths[i], i))                      # parents first
    if not chosen:
        return CandidateTree.empty(device)
    new_index = {old: new for new, old in enumerate(chosen)}
    parents = tuple(-1 if parent_of[i] < 0 else new_index[parent_of[i]] for i in chosen)
    tokens = torch.stack([level_tokens[depths[i]][flat_at[i]] for i in chosen])           # [N]
    return CandidateTree(tokens.to(device), parents)
