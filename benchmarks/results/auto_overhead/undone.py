"""This change's per-step savings undone, for benchmarks/results/auto_gate/rows.py's old_* rows (PATCH=this file):
the empty tree made anew, a select of every node and a merge of no paths doing the work they did at 65e125a, every
tree's keys computed afresh, verify_cost not read from a list within a proposal, a CPU's token table read by a gather
per level (as on a GPU)."""
import contextlib
from unittest import mock

import torch

import specdec.strategies.auto as auto_module
import specdec.strategies.token_recycling as recycling_module
from specdec.strategies.auto import Auto
from specdec.tree import CandidateTree, host_to_device, merge_into_trie

select, merge_paths, estimates = CandidateTree.select, auto_module.merge_paths, Auto._estimates


def old_select(self, keep):            # every node kept: a new tree all the same, as at 65e125a
    if len(keep) != self.num_nodes:
        return select(self, keep)
    index = host_to_device(list(keep), self.tokens.device)
    probs = None if self.draft_probs is None else self.draft_probs[index]
    return CandidateTree(self.tokens[index], self.parents, probs, self.siblings)


def old_merge_paths(tree, paths, max_nodes=None):     # no paths: the trie built all the same
    if not paths:
        merge_into_trie(tree.tokens.tolist(), tree.parents, paths, max_nodes)
    return merge_paths(tree, paths, max_nodes)


def old_estimates(self, *args, **kwargs):             # every tree's keys computed afresh
    self.keys_by_shape.clear()
    return estimates(self, *args, **kwargs)


@contextlib.contextmanager
def undone():
    with mock.patch.object(CandidateTree, "select", old_select), \
            mock.patch.object(CandidateTree, "empty",
                              classmethod(lambda cls, device="cpu": cls(torch.empty(0, dtype=torch.long, device=device), ()))), \
            mock.patch.object(auto_module, "merge_paths", old_merge_paths), \
            mock.patch.object(Auto, "_estimates", old_estimates), \
            mock.patch.object(Auto, "verify_cost", Auto._verify_cost), \
            mock.patch.object(recycling_module, "reads_on_host", lambda table: False):
        yield
