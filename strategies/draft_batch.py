"""One draft model's forwards for every row of a batch call (specdec.batch).

Each row of a batch drafts with a DraftModel of its own (a per-call copy: its committed count, its
tail, its adaptive gamma), but their KV caches live here, side by side in one ragged buffer (the
target's own batch machinery, specdec.batch.BatchVerifier: each row at its own fill, per-row masks and
positions). A step then runs ONE draft forward for all rows' catch-up (the pending token, and the
accepted drafted token the draft was not fed) and one per chain position, instead of one per row
each: on a small draft the forward's fixed cost, not its width, is what a step pays.

A row's drafted tokens are written after its fill and kept provisionally (the next position attends
to them); the row's observe then sets its fill to the committed entries plus the accepted drafted
ones it was fed, a leading run of a chain, so nothing moves. Rows that do not draft this step (auto
skipped its drafter, a row at its last token) ride along in the forward without keeping anything.
A long catch-up (a new row's prompt, the tokens of steps auto drafted nothing) is fed first, all such
rows together, keeping only the last token's logits, so the step's catch-up stays at most 2 wide.

Trees (draft.branching) grow a level per forward, and a level's nodes must see their ancestors only:
the tree-masked forward of BatchVerifier takes a pending token and a tree below it. So a tree row's
pending token is caught up and then left out of its fill, and each level's forward feeds every row's
pending token and its whole tree so far (the level's logits are read from its own rows): the draft is
small and its forward's width costs little beside its fixed cost, and a row that asks nothing this
round writes again what it wrote. The row's observe keeps the pending token and its accepted nodes.
"""
from __future__ import annotations

from typing import Sequence

import torch

from specdec.batch import BatchVerifier
from specdec.tree import CandidateTree
from specdec.types import DecodeState
from specdec.verifier import CATCH_UP_CHUNK

SHORT_CATCH_UP = 2        # tokens a step's catch-up feeds with its logits read (tail + pending)


class DraftBatch:
    """The rows of one draft model in a batch call, keyed by the DraftModel that drafts each row."""

    def __init__(self, draft, layout, tables=None):
        self.rows = BatchVerifier(draft, layout, tables)       # tables: the draft model's (DraftModel.tables)
        self.row_of: dict[int, int] = {}       # id(drafter) -> its row
        self.device = draft.device

    def _row(self, drafter) -> int:
        """The drafter's row, a new empty one (after the others) the first time."""
        key = id(drafter)
        if key not in self.row_of:
            row = self.rows.rows
            self.rows.set_row(row, self.rows.cache.layers, 0, 0, 0)
            self.row_of[key] = row
        return self.row_of[key]

    @torch.inference_mode()
    def release(self, drafter) -> None:
        """The drafter's row finished: drop it (the last rows move into its place)."""
        row = self.row_of.pop(id(drafter), None)
        if row is None:
            return
        order = self.rows.drop_rows([row])
        new_row = {old: new for new, old in enumerate(order)}
        self.row_of = {key: new_row[old] for key, old in self.row_of.items()}

    @torch.inference_mode()
    def keep(self, drafter, fill: int) -> None:
        """The drafter's row keeps its first `fill` entries (its observe: committed + accepted fed ones)."""
        row = self.row_of[id(drafter)]
        self.rows.fills[row] = fill
        self.rows._sync_fill(row)

    def _forward(self, inputs: dict[int, torch.Tensor], logits_to_keep: int = 0, prefill: bool = False) -> torch.Tensor:
        """One draft forward over every row: row r feeds inputs[r] ([C] on the device) after its fill and
        keeps them; rows without inputs feed a throw-away token and keep nothing. Logits [B, R, V].
        prefill: a long catch-up (a prompt), whose masks need no table (BatchVerifier.forward)."""
        pending, trees = [], []
        for row in range(self.rows.rows):
            tokens = inputs.get(row)
            if tokens is None:
                pending.append(0)
                trees.append(CandidateTree.empty(self.device))
            else:
                pending.append(tokens[:1])
                trees.append(CandidateTree.chain(tokens[1:]))
        logits, _ = self.rows.forward(pending, trees, None, logits_to_keep=logits_to_keep, prefill=prefill)
        for row, tokens in inputs.items():
            self.rows.commit(row, range(len(tokens)))
        return logits

    @torch.inference_mode()
    def keep_tree(self, drafter, node_rows: Sequence[int], node_rows_on_device: torch.Tensor | None = None) -> None:
        """A tree row's observe: keep its pending token and the fed nodes at node_rows (their order
        among the fed nodes: node k was fed at row 1 + k of the last forward) after its fill.
        node_rows_on_device: the same [K] on the device (None where they are 0..K-1: nothing moves)."""
        on_device = None
        if node_rows_on_device is not None:
            on_device = torch.cat([node_rows_on_device.new_zeros(1), node_rows_on_device + 1])      # [1 + K]
        self.rows.commit(self.row_of[id(drafter)], [0] + [1 + k for k in node_rows], on_device)

    @torch.inference_mode()
    def tree_forward(self, fed: Sequence[tuple]) -> list[torch.Tensor]:
        """One draft forward: each (drafter, pending token [1], tree so far) feeds its pending token and
        its tree after its fill, keeping nothing; other rows ride along. Per drafter the logits
        [1 + tree nodes, Vd] of its rows."""
        rows = {self.row_of[id(drafter)]: (token, tree) for drafter, token, tree in fed}
        empty = CandidateTree.empty(self.device)
        pending = [rows[row][0] if row in rows else 0 for row in range(self.rows.rows)]
        trees = [rows[row][1] if row in rows else empty for row in range(self.rows.rows)]
        logits, _ = self.rows.forward(pending, trees, None)                                # [B, R, Vd]
        return [logits[self.row_of[id(drafter)], : 1 + tree.num_nodes] for drafter, _, tree in fed]

    @torch.inference_mode()
    def catch_up(self, drafters: Sequence, states: Sequence[DecodeState], under_tree: bool = False):
        """Feed every drafter's unfed committed tokens (DraftModel.unfed): per drafter the draft's
        logits [V] at its last committed token (the pending one). under_tree: the pending tokens are
        left out of the rows' fills, to be fed again under each tree level (tree_forward); then
        (the logits, per drafter its pending token [1])."""
        rows = [self._row(drafter) for drafter in drafters]
        new = [drafter.unfed(state.token_ids, state.pending) for drafter, state in zip(drafters, states)]
        for drafter, state in zip(drafters, states):
            drafter.cached = len(state.token_ids)
        # a step's tokens: the tail and the pending one, and with a table chain (draft.table_chain) the chain's kept
        # nodes in the tail too; fed with the logits read, in one forward. Longer runs are prompts and gaps
        short_width = SHORT_CATCH_UP + max(drafter.table_chain for drafter in drafters)
        long = {row: tokens[:-short_width] for row, tokens in zip(rows, new) if len(tokens) > short_width}
        while long:                                # prompts and gaps, CATCH_UP_CHUNK tokens a forward
            self._forward({row: tokens[:CATCH_UP_CHUNK] for row, tokens in long.items()}, logits_to_keep=1,
                          prefill=True)
            long = {row: tokens[CATCH_UP_CHUNK:] for row, tokens in long.items() if len(tokens) > CATCH_UP_CHUNK}
        short = {row: tokens[-short_width:] for row, tokens in zip(rows, new)}
        logits = self._forward(short)                                              # [B, <= short_width, V]
        at_pending = [drafter.fit_vocab(logits[row, len(short[row]) - 1: len(short[row])])[0]
                      for drafter, row in zip(drafters, rows)]
        if not under_tree:
            return at_pending
        for row in rows:
            self.rows.fills[row] -= 1
            self.rows._sync_fill(row)
        return at_pending, [short[row][-1:] for row in rows]

    @torch.inference_mode()
    def feed(self, fed: Sequence[tuple]) -> list[torch.Tensor]:
        """chains' feed: each (drafter, token [1]) fed after its row's entries, all in one forward; the
        draft's logits [V] there per drafter."""
        rows = [self.row_of[id(drafter)] for drafter, _ in fed]
        logits = self._forward({row: token.view(1) for row, (_, token) in zip(rows, fed)})   # [B, 1, V]
        return [drafter.fit_vocab(logits[row, :1])[0] for row, (drafter, _) in zip(rows, fed)]
