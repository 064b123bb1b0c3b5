"""Drafting at temperature > 0 with the drafter's real distributions, shared by the neural drafters.

Sibling tokens are drawn without replacement from a draft distribution through the call's one
random source (DecodeState.rng.draw_without_replacement), on the device: the loop's
TorchRandom makes exactly torch.multinomial's draw without replacement minus its reads back to
the host (tests check the two agree token for token), and a single token (a chain) by its own
cheaper draw of the same law; the law tests' enumerating source answers the same method.

`sampled_tree` is the EAGLE-2-style sampled tree (eagle and medusa): per depth the `width` best
slots are filled, a slot (parent, i) scored by the parent's cumulative log-probability plus the log
of the i-th largest probability of the parent's distribution - a score that does not look at the
token the slot will receive - then each parent's children are drawn without replacement from its
distribution q and tried in drawn order by the verifier. Which nodes exist depends only on nodes
drawn earlier, never on a node's own token among its siblings, so recursive rejection sampling
stays exact. Host reads: one per depth (the slot scores); tokens and scores stay on the device.
"""
from __future__ import annotations

from typing import Callable

import torch

from specdec.strategies.lockstep import run_steps
from specdec.tree import WITHOUT_REPLACEMENT, CandidateTree


# next_probs(depth, nodes, tokens, parents) -> [n, V] the distributions of the children of the new
# tree nodes `nodes` (at `depth`; their tokens [n] on the device; parents: every node's parent so far)
NextProbs = Callable[[int, list, torch.Tensor, list], torch.Tensor]


def sampled_tree(root_probs: torch.Tensor, next_probs: NextProbs, depth_limit: int, max_nodes: int,
                 width: int, rng) -> CandidateTree:
    """The sampled tree below the pending token: root_probs [V] is the distribution of its children."""
    return run_steps(sampled_tree_steps(root_probs, depth_limit, max_nodes, width, rng), next_probs)


def sampled_tree_steps(root_probs: torch.Tensor, depth_limit: int, max_nodes: int, width: int, rng):
    """sampled_tree as a step generator (strategies.lockstep): yields each `next_probs` request
    (depth, nodes, tokens, parents), takes its answer (the distributions [n, V]) by send(), returns
    the tree."""
    device = root_probs.device
    tokens: list[torch.Tensor] = []          # per sibling group: [c] drawn tokens
    parents: list[int] = []
    rows: list[torch.Tensor] = []            # per sibling group: [c, V] the q its tokens were drawn from
    frontier_nodes = [-1]
    frontier_probs = root_probs[None]                                    # [n, V]
    frontier_scores = torch.zeros(1, device=device)                      # [n] cumulative log-prob
    for depth in range(depth_limit):
        budget = min(width, max_nodes - len(parents))
        if budget <= 0 or not frontier_nodes:
            break
        top = frontier_probs.topk(min(width, frontier_probs.shape[-1]), dim=-1).values       # [n, k]
        slot_scores = (frontier_scores[:, None] + top.log()).tolist()   # the depth's one host read
        slots = [(score, rank, f) for f, row in enumerate(slot_scores) for rank, score in enumerate(row)
                 if score != float("-inf")]                             # q = 0: no slot
        slots.sort(key=lambda s: (-s[0], s[1], s[2]))
        counts = [0] * len(frontier_nodes)
        for _, _, f in slots[:budget]:                                  # a prefix of each parent's ranks
            counts[f] += 1
        level_tokens, level_scores, level_nodes = [], [], []
        for f, count in enumerate(counts):
            if not count:
                continue
            q = frontier_probs[f]                                                           # [V]
            drawn = rng.draw_without_replacement(q, count)                                  # [c]
            level_nodes += range(len(parents), len(parents) + count)
            parents += [frontier_nodes[f]] * count
            tokens.append(drawn)
            rows.append(q.expand(count, -1))
            level_tokens.append(drawn)
            level_scores.append(frontier_scores[f] + q[drawn].log())                        # [c]
        if depth == depth_limit - 1 or len(parents) >= max_nodes or not level_nodes:
            break
        level_tokens_flat = torch.cat(level_tokens)                                         # [m]
        frontier_probs = yield depth, level_nodes, level_tokens_flat, parents                      # [m, V]
        frontier_scores = torch.cat(level_scores)                                           # [m]
        frontier_nodes = level_nodes
    if not parents:
        return CandidateTree.empty(device)
    return CandidateTree(torch.cat(tokens), tuple(parents), torch.cat(rows), WITHOUT_REPLACEMENT)
