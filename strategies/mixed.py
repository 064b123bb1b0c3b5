"""Mixed trees: a neural drafter's tree and prompt-lookup paths merged into ONE CandidateTree.

The neural tree's nodes come first, unchanged (same indices, same draft distributions, same
sibling mode); each lookup path then walks down from the root, reusing any node with its token
(shared prefixes merge) and appending new point-mass nodes below. So in every sibling group the
neural drafter's children come first and lookup children after them.

Why this is lossless at temperature > 0 with no change to acceptance: a point-mass proposal x
is a draft row one-hot on x (accept with probability r(x); on rejection clamp(r - onehot) zeroes x).
Acceptance tries siblings in index order; the neural siblings were drawn exactly as the drafter
says (independently, or without replacement among themselves), and a lookup child tried after
them is a deterministic function of what came before, one-hot on a token that no earlier
sibling holds (it would have merged), so with siblings = without_replacement the rule's
renormalisation leaves its one-hot row unchanged. (The other order - a lookup token first and
sampled siblings after it - needs them drawn without replacement with the lookup token removed, or
from the whole q with a draw of it dropped, the same law; tests/test_mixed_law.py enumerates both,
and a negative control.)
"""
from __future__ import annotations

from typing import Sequence

import torch

from specdec.tree import INDEPENDENT, CandidateTree, merge_into_trie, host_to_device

NEURAL = "neural"
LOOKUP = "lookup"


def merge_paths(tree: CandidateTree, paths: Sequence[Sequence[int]], max_nodes: int | None = None
                ) -> tuple[CandidateTree, list[str]]:
    """(merged tree, source of each node: NEURAL or LOOKUP). The tree's draft_probs, if any, get a
    one-hot row per lookup node; lookup nodes beyond max_nodes (in all) are dropped."""
    if not paths:                                # nothing to merge: the tree itself (no read of its tokens)
        return tree, [NEURAL] * tree.num_nodes
    tokens, parents = merge_into_trie(tree.tokens.tolist(), tree.parents, paths, max_nodes)
    added = len(tokens) - tree.num_nodes
    source = [NEURAL] * tree.num_nodes + [LOOKUP] * added
    if added == 0:
        return tree, source
    device = tree.tokens.device
    new_tokens = host_to_device(tokens, device)          # [N]
    draft_probs = tree.draft_probs
    if draft_probs is not None:
        one_hot = torch.zeros(added, draft_probs.shape[1], dtype=draft_probs.dtype, device=draft_probs.device)
        one_hot[torch.arange(added), new_tokens[tree.num_nodes:].to(draft_probs.device)] = 1.0   # [added, V]
        draft_probs = torch.cat([draft_probs, one_hot])                        # [N, V]
    siblings = tree.siblings if tree.num_nodes else INDEPENDENT
    return CandidateTree(new_tokens, tuple(parents), draft_probs, siblings), source
