"""One EAGLE drafter's forwards for every row of a batch call (specdec.batch).

Each row drafts with an Eagle of its own (a per-call copy: its committed rows, unfed features, tree
bookkeeping), but the drafter's keys and values of all rows live here, side by side
(heads.eagle.RaggedRows: each row at its own fill). A step then runs ONE drafter forward for every
row's catch-up (the features the last verify produced) and one per tree level for all rows, instead
of one per row each: the rows build their trees in lockstep (strategies.lockstep), each exactly the
tree it builds alone. Greedy and coupled rows (best-first trees) read their children's scores in one
host read per level for the whole batch.

A row's tree rows are written after its fill and never kept (the next step's catch-up overwrites
them), as in the single-row cache. Rows of a forward are padded to its widest row; a padding row
sees itself only and is never read.
"""
from __future__ import annotations

from typing import Sequence

import torch

from specdec.heads.eagle import RaggedRows
from specdec.sampling import logits_to_probs
from specdec.strategies.best_first import best_first_steps, top_children
from specdec.strategies.lockstep import run_together
from specdec.strategies.sampled_tree import sampled_tree_steps
from specdec.tree import CandidateTree, host_to_device
from specdec.types import DecodeState
from specdec.verifier import CATCH_UP_CHUNK

SHORT_CATCH_UP = 16     # rows a step's catch-up feeds with every row together (a verify's features);
#                         longer ones (a new prompt, auto's gaps) are fed apart, CATCH_UP_CHUNK at a time


class EagleBatch:
    """The rows of one EAGLE drafter in a batch call, keyed by the Eagle that drafts each row."""

    def __init__(self, drafter, device):
        self.drafter, self.device = drafter, device
        self.kv = RaggedRows()
        self.row_of: dict[int, int] = {}        # id(eagle) -> its row (rows 0 .. len - 1; a row's fill is its eagle's fed)

    def _row(self, eagle) -> int:
        return self.row_of.setdefault(id(eagle), len(self.row_of))

    def release(self, eagle) -> None:
        """The eagle's row finished: drop it (the rows after it move up)."""
        row = self.row_of.pop(id(eagle), None)
        if row is None:
            return
        order = [r for r in range(len(self.row_of) + 1) if r != row]
        self.kv.drop([r for r in order if r < self.kv.rows])
        new_row = {old: new for new, old in enumerate(order)}
        self.row_of = {key: new_row[old] for key, old in self.row_of.items()}

    # ------------------------------------------------------------------ one forward over some rows
    def _forward(self, rows: list[int], g: list[torch.Tensor], tokens: list[torch.Tensor],
                 positions: list[torch.Tensor], visible: list[torch.Tensor], start: list[int]) -> list[torch.Tensor]:
        """One drafter forward: row rows[i] feeds g[i] [n_i, H], tokens[i] [n_i], positions[i] [n_i]
        written from cache row start[i], each new row seeing visible[i] [n_i, start[i] + n_i]; the
        outputs [n_i, H] per row. Padded to the widest row."""
        n = max(part.shape[0] for part in g)
        width = max(start) + n
        b, device = len(rows), self.device
        g_in = g[0].new_zeros(b, n, g[0].shape[-1])                                          # [b, n, H]
        token_in = torch.zeros(b, n, dtype=torch.long, device=device)                        # [b, n]
        position_in = torch.zeros(b, n, dtype=torch.long, device=device)                     # [b, n]
        visible_in = torch.zeros(b, n, width, dtype=torch.bool, device=device)               # [b, n, width]
        pad = torch.arange(n, device=device)
        for i, (row_g, row_tokens, row_positions, row_visible, row_start) in enumerate(
                zip(g, tokens, positions, visible, start)):
            m = row_g.shape[0]
            g_in[i, :m], token_in[i, :m], position_in[i, :m] = row_g, row_tokens, row_positions
            visible_in[i, :m, : row_visible.shape[-1]] = row_visible
            if m < n:                   # padding rows see themselves: a valid softmax, never read
                visible_in[i, pad[m:], row_start + pad[m:]] = True
        every = rows == list(range(self.kv.rows)) and len(rows) == self.kv.rows
        index = None if every else host_to_device(rows, device)
        self.kv.prepare(index, host_to_device(start, device), width, max(rows) + 1)
        out, _, _, _ = self.drafter(g_in, token_in, position_in, visible=visible_in, with_logits=False, cache=self.kv)
        return [out[i, : part.shape[0]] for i, part in enumerate(g)]

    def _logits(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per row, the drafter's logits [n_i, V] (fp32) of its outputs [n_i, H]: one lm_head call."""
        logits = self.drafter.logits(torch.cat(outs)).float()
        return list(logits.split([out.shape[0] for out in outs]))

    # ------------------------------------------------------------------ catch-up
    @torch.inference_mode()
    def catch_up(self, eagles: Sequence, states: Sequence[DecodeState]) -> None:
        """Feed every eagle's unfed committed rows (its `take_unfed`) and set its root: the rows with a
        verify's few features in one forward, long ones (prompts, gaps) apart, all of them together
        per CATCH_UP_CHUNK rows."""
        fed: dict[int, tuple] = {}                # index into eagles -> (g [m, H], tokens [m])
        for i, (eagle, state) in enumerate(zip(eagles, states)):
            self._row(eagle)
            unfed = eagle.take_unfed(state.token_ids)
            if unfed is not None:
                fed[i] = unfed
        last: dict[int, torch.Tensor] = {}
        short = {i: part for i, part in fed.items() if part[0].shape[0] <= SHORT_CATCH_UP}
        long = {i: part for i, part in fed.items() if i not in short}
        if short:
            last.update(self._feed_committed(eagles, short))
        while long:
            last.update(self._feed_committed(eagles, {i: (g[:CATCH_UP_CHUNK], t[:CATCH_UP_CHUNK])
                                                      for i, (g, t) in long.items()}))
            long = {i: (g[CATCH_UP_CHUNK:], t[CATCH_UP_CHUNK:]) for i, (g, t) in long.items() if len(g) > CATCH_UP_CHUNK}
        if last:
            order = sorted(last)
            for i, logits in zip(order, self._logits([last[i][None] for i in order])):
                eagles[i].root = (last[i], logits[0])              # (out [H], logits [V])

    def _feed_committed(self, eagles: Sequence, parts: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """Feed parts[i] = (g [m, H], tokens [m]) after eagle i's committed rows and keep them; the
        last row's output [H] per eagle."""
        order = sorted(parts, key=lambda i: self.row_of[id(eagles[i])])
        rows = [self.row_of[id(eagles[i])] for i in order]
        g, tokens, positions, visible, start = [], [], [], [], []
        for i in order:
            eagle, (part_g, part_tokens) = eagles[i], parts[i]
            m = part_g.shape[0]
            g.append(part_g)
            tokens.append(part_tokens)
            positions.append(torch.arange(eagle.fed, eagle.fed + m, device=self.device))
            visible.append(torch.ones(m, eagle.fed + m, dtype=torch.bool, device=self.device).tril(eagle.fed))
            start.append(eagle.fed)
        outs = self._forward(rows, g, tokens, positions, visible, start)
        for i in order:
            eagles[i].fed += parts[i][0].shape[0]
        return {i: out[-1] for i, out in zip(order, outs)}

    # ------------------------------------------------------------------ trees in lockstep
    @torch.inference_mode()
    def trees(self, eagles: Sequence, states: Sequence[DecodeState], depths: Sequence[int]) -> list[CandidateTree]:
        """Every eagle's tree (greedy / coupled: best-first; rejection sampling: sampled), built side by
        side: one drafter forward per level for all rows, each row's tree what it builds alone."""
        builders, kinds, boxes = [], [], []
        for eagle, state, depth in zip(eagles, states, depths):
            root_out, root_logits = eagle.root
            box = eagle._new_tree(root_out)
            if state.sampling.greedy or state.noise is not None:
                builders.append(best_first_steps(depth, eagle.max_nodes, self.device, eagle.expand, eagle.stop_below))
                kinds.append(("children", eagle.scorer(state), root_logits))
            else:
                root_probs = logits_to_probs(root_logits, state.sampling)
                builders.append(sampled_tree_steps(root_probs, depth,
                                                   eagle.max_nodes, eagle.sampled_top_k, state.rng))
                kinds.append(("probs", None, None))
            boxes.append(box)

        def answer_all(requests: dict[int, tuple]) -> dict[int, object]:
            logits: dict[int, torch.Tensor] = {}
            fed = {}
            for i, (depth, nodes, tokens, parents) in requests.items():
                kind, _, root_logits = kinds[i]
                if kind == "children" and tokens is None:      # the pending token's children
                    logits[i] = root_logits[None]                                           # [1, V]
                    continue
                boxes[i]["parent"] = parents
                level = depth - 1 if kind == "children" else depth
                fed[i] = eagles[i].level_inputs(boxes[i], nodes, tokens, level)
            if fed:
                order = sorted(fed, key=lambda i: self.row_of[id(eagles[i])])
                outs = self._forward([self.row_of[id(eagles[i])] for i in order], *zip(*(fed[i] for i in order)))
                for i, out, row_logits in zip(order, outs, self._logits(outs)):
                    eagles[i].level_outputs(boxes[i], requests[i][1], out)
                    logits[i] = row_logits                                                  # [n, V]
            answers: dict[int, object] = {}
            children = [i for i in logits if kinds[i][0] == "children"]
            if children:                  # every best-first row's ranked children: one host read
                scores = [logits[i] if kinds[i][1] is None else kinds[i][1](logits[i], requests[i][0]) for i in children]
                values, indices = top_children(torch.cat(scores), max(eagles[i].top_k for i in children))
                start = 0
                for i, part in zip(children, scores):
                    n, k_i = part.shape[0], eagles[i].top_k
                    answers[i] = ([row[:k_i] for row in values[start: start + n]], indices[start: start + n, :k_i])
                    start += n
            for i in logits:
                if kinds[i][0] == "probs":
                    answers[i] = logits_to_probs(logits[i], states[i].sampling)
            return answers

        return run_together(builders, answer_all)

