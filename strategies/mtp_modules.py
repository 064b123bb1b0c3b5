"""Drafting with several MTP modules, as Hugging Face's `MtpModel` chains them (transformers'
modeling_layers.MtpModel.forward and generation's MTPCandidateGenerator).

Module k (k >= 1) has a KV cache of its own. Its row t reads module k - 1's output at row t and
token t + k + 1 (module 0's row t: the target's feature at t and token t + 1), so over a context of
C committed tokens its committed rows are 0 .. C - k - 1, and module k - 1's last committed row,
C - k, is where its first drafted row starts. The tree's first level comes from module 0's last
committed row (the eagle strategy's root). The children of a node at tree depth e come from module
e, run over the node's whole path: its row for the path's node at depth d (1 <= d <= e) sits at
row C - e + d - 1, reads that node's token and module e - 1's output at the row of the node's
parent (the last committed row of module e - 1 for d = 1), and sees module e's committed rows and
its ancestors' rows. For a chain this is Hugging Face's drafting, one token per module. Deeper than
the modules, the last module goes on as a lone module does: one new row per depth, fed its own
output at the parent's row (vLLM's way; with one module this is the eagle strategy's drafting).
"""
from __future__ import annotations

import torch

from specdec.cache import BufferedLayer
from specdec.tree import host_to_device, tree_visibility
from specdec.verifier import CATCH_UP_CHUNK


class DeeperModules:
    """The committed rows of MTP modules 1 .. n - 1 of one call, and their tree rows while a tree is drafted."""

    def __init__(self, drafter, modules: int, device, tables, module_zero_cache: BufferedLayer):
        self.drafter, self.modules, self.device, self.tables = drafter, modules, device, tables
        # kv[k]: module k's rows; module 0's cache is the eagle strategy's
        self.kv = [module_zero_cache] + [BufferedLayer() for _ in range(1, modules)]
        self.fed = [0] * modules                                # committed rows in kv[k]
        # tail[k] = (its first row, module k's outputs [m, H] of its committed rows from there on): what
        # module k + 1 has still to read
        self.tail: list[tuple[int, torch.Tensor | None]] = [(0, None)] * modules

    def run(self, module: int, g, tokens, positions, start: int, visible=None) -> torch.Tensor:
        """Module `module` over rows g [m, H], tokens [m], positions [m], written at row `start` of its cache
        (rows after it dropped); visible [m, start + m] bool (None: causal). Returns out [m, H]."""
        cache = self.kv[module]
        out, _, _, _ = self.drafter(g[None], tokens[None], positions[None], visible=None if visible is None else
                                    visible[None], with_logits=False, cache=cache, start=start, module=module)
        return out[0]

    def module_zero_fed(self, first_row: int, out: torch.Tensor) -> None:
        """Module 0 (the eagle strategy's cache) fed its committed rows from `first_row` on, with outputs out [m, H]."""
        self._extend(0, first_row, out)

    def catch_up(self, token_ids: list[int]) -> None:
        """Feed modules 1 .. n - 1 the committed rows they lack, module by module (each reads the one before)."""
        committed = len(token_ids) - 1                         # C: module 0's committed rows
        for k in range(1, self.modules):
            end = committed - k                                # module k's committed rows: 0 .. end - 1
            first, before = self.tail[k - 1]
            if end <= self.fed[k] or before is None:
                continue
            for a in range(self.fed[k], end, CATCH_UP_CHUNK):
                b = min(a + CATCH_UP_CHUNK, end)
                rows = torch.arange(a, b, device=self.device)                                  # [m]
                tokens = host_to_device(token_ids[a + k + 1: b + k + 1], self.device)          # [m]
                self._extend(k, a, self.run(k, before[a - first: b - first], tokens, rows, start=a))
            self.fed[k] = end
            self.tail[k - 1] = (end, before[end - first:])     # module k - 1's rows from `end`: end is its last

    def _extend(self, module: int, first_row: int, out: torch.Tensor) -> None:
        if module == self.modules - 1:                         # the last module feeds no other
            return
        first, before = self.tail[module]
        if before is None:
            self.tail[module] = (first_row, out)
        else:
            self.tail[module] = (first, torch.cat([before[: first_row - first], out]))

    def ready(self, committed: int) -> bool:
        """Whether every module has a committed row to start its drafted rows from (a context of at least n tokens)."""
        return all(self.tail[k][1] is not None and self.tail[k][0] + len(self.tail[k][1]) > committed - k - 1
                   for k in range(self.modules - 1))

    # ------------------------------------------------------------------ a tree level
    def feed(self, tree: dict, nodes: list[int], tokens: torch.Tensor, depth: int, committed: int) -> torch.Tensor:
        """The children's logits [n, V] of the tree nodes `nodes` (all at tree depth depth + 1, tokens [n] theirs
        on the device) over a context of `committed` (C) tokens: module depth + 1 over their paths, or the last
        module, one row each, deeper than the modules. tree: the eagle strategy's tree dict (its parent list)."""
        parents = tree["parent"]
        token_of = tree.setdefault("token", {})
        for i, node in enumerate(nodes):
            token_of[node] = tokens[i]
        depth_of = tree.setdefault("depth", {})
        for node in nodes:
            depth_of[node] = depth + 1
        k = min(depth + 1, self.modules - 1)
        rows = tree.setdefault("modules", {}).setdefault(k, {"parents": [], "column": {}, "out": {}})
        if depth + 1 <= k:
            new = _paths(nodes, parents)                       # module k's first level: every node on the paths
            reads = tree["modules"].get(k - 1, {"out": {}})["out"]
        else:
            new, reads = nodes, rows["out"]                    # deeper: the last module fed its own output
        first_tail, tail = self.tail[k - 1]
        last_committed = tail[committed - k - first_tail]      # [H] module k - 1's output at its last committed row
        g = torch.stack([last_committed if parents[u] < 0 else reads[parents[u]] for u in new])       # [m, H]
        before = len(rows["parents"])
        rows["parents"] += [rows["column"].get(parents[u], -1) for u in new]
        positions = host_to_device([committed - k + depth_of[u] - 1 for u in new], self.device)      # [m]
        visible = tree_visibility(rows["parents"], self.fed[k], self.device, first_row=before, tables=self.tables)
        out = self.run(k, g, torch.stack([token_of[u] for u in new]), positions, self.fed[k] + before, visible)
        for i, u in enumerate(new):
            rows["out"][u], rows["column"][u] = out[i], before + i
        return self.drafter.logits(torch.stack([rows["out"][u] for u in nodes])).float()            # [n, V]


def _paths(nodes: list[int], parents: list[int]) -> list[int]:
    """Every node on the paths from the root to `nodes`, parents before children (by node index: a parent is
    always drafted before its children)."""
    on_paths: set[int] = set()
    for node in nodes:
        while node >= 0 and node not in on_paths:
            on_paths.add(node)
            node = parents[node]
    return sorted(on_paths)
