"""Many prompts at once: rows side by side, one target forward per step over all of them.

Each row is a Decoding of its own (specdec.loop): its committed tokens, strategy state (a per-call
copy of the Speculator's strategy), stop rules, random stream and stats. A step asks every row's
strategy for its tree, runs ONE forward of the target over [B, 1 + largest tree] (each row its
pending token, its tree, padding after it), then settles each row with its own rows of the output:
acceptance, commit of its accepted path at its own fill level, stop rules, observe. A row that
finishes hands its slot to the next waiting prompt (continuous batching inside one call).

Prompts that start together are prefilled together: one forward per chunk for the group (the
chunk shared out between its rows, so prefill_chunk bounds a forward's tokens as for one prompt).

The ragged batch lives in the KV cache (RowLayer): one buffer per layer for all rows, each row with
its own fill; a forward writes row b's new entries right after its own fill, and the attention mask
hides from row b every slot past its own entries (stale rows, other rows' longer histories, the
padding). Positions are per row (fill + depth). Padding rows hang off the pending token (they see
the prefix, it and themselves, so their softmax is valid) and are never committed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .acceptance import Verdict, accept_greedy, rejection_start, rejection_walk, walk_values
from .compiled import padded_parents
from .loop import Decoding, feature_layers, prefill_top_k
from .sampling import logits_to_probs
from .errors import IncompatibleModelsError
from .models import AttentionLayout, cache_kwargs, check_cacheable
from .row_linear import runs_packed
from .tables import ShapeTables
from .tree import (CandidateTree, chain_masks, chain_position_ids, to_device, tree_masks, tree_position_ids,
                   with_pending_root)
from .types import GenerationOutput, Stats
from .verifier import Prefilled, Verifier, hidden_request, top_k_ids
from .tree import host_to_device


class RowLayer(DynamicLayer):
    """One layer's keys and values for B rows of different lengths: buffers [B, heads, capacity, dim]
    (keys and values apart: their head sizes may differ). Before a forward the batch sets
    `write_at` [B] (each row's fill) and `width` (the key length the forward attends over); an
    update writes row b's R entries at write_at[b] .. write_at[b] + R and returns the buffers up to
    `width`."""

    def __init__(self):
        super().__init__()
        self.key_buffer = self.value_buffer = None
        self.write_at: torch.Tensor | None = None     # [B] long
        self.width = 0
        self.wanted_capacity = 0                      # slots to allocate at the first update, if no row had KV
        self.is_initialized = True                    # buffers come from add_row, not from an update

    def allocate(self, rows: int, capacity: int, like_keys: torch.Tensor, like_values: torch.Tensor) -> None:
        """Buffers of `rows` rows and `capacity` slots shaped after a row's keys / values [1, H, L, D],
        the filled slots of the old buffers kept."""
        keys = like_keys.new_zeros(rows, like_keys.shape[1], capacity, like_keys.shape[-1])
        values = like_values.new_zeros(rows, like_values.shape[1], capacity, like_values.shape[-1])
        if self.key_buffer is not None:
            kept_rows, kept_slots = min(rows, self.key_buffer.shape[0]), min(capacity, self.key_buffer.shape[2])
            keys[:kept_rows, :, :kept_slots] = self.key_buffer[:kept_rows, :, :kept_slots]
            values[:kept_rows, :, :kept_slots] = self.value_buffer[:kept_rows, :, :kept_slots]
        self.key_buffer, self.value_buffer = keys, values
        self.keys, self.values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        batch, _, new, _ = key_states.shape                                               # [B, H, R, D]
        if self.key_buffer is None:          # every row so far had an empty prefix: shapes known only now
            self.allocate(batch, self.wanted_capacity, key_states, value_states)
        slots = self.write_at[:, None] + torch.arange(new, device=key_states.device)      # [B, R]
        rows = torch.arange(batch, device=key_states.device)[:, None].expand(batch, new)  # [B, R]
        self.key_buffer[rows, :, slots] = key_states.transpose(1, 2)                      # [B, R, H, D]
        self.value_buffer[rows, :, slots] = value_states.transpose(1, 2)
        self.keys = self.key_buffer[:, :, : self.width]
        self.values = self.value_buffer[:, :, : self.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.width

    def keep(self, row: int, fill: int, slots: torch.Tensor) -> None:
        """Commit of one row: its entries at `slots` [K] move to fill .. fill + K."""
        self.key_buffer[row, :, fill: fill + len(slots)] = self.key_buffer[row].index_select(1, slots)
        self.value_buffer[row, :, fill: fill + len(slots)] = self.value_buffer[row].index_select(1, slots)


class BatchVerifier:
    """The target's forward over a ragged batch: rows added from prefilled single-row verifiers,
    one forward for all rows' [pending] + trees, each row's commit at its own fill. `tables`: where the
    rows' tree shape tables are kept (its verifier's; a chain row, a prefill's too, needs none)."""

    def __init__(self, model, layout: AttentionLayout, tables: ShapeTables | None = None,
                 row_model=None, row_linear: int = 0):
        if layout.recurrent:
            raise IncompatibleModelsError(
                f"the target ({type(model).__name__}) has linear-attention layers, whose recurrent state specdec "
                f"rolls back for one sequence only: generate one prompt at a time (one call per prompt, not a list of prompts)")
        self.model, self.layout = model, layout
        # forwards of at most row_linear rows in all (batch x width) run through row_model, the model's
        # RowLinear twin (specdec.row_linear), as the single-row verifier's do (0: none)
        self.row_model, self.row_linear = row_model, int(row_linear) if row_model is not None else 0
        self.packed = runs_packed(row_model)     # packed weights win at every row count: every forward takes them
        self.tables = tables if tables is not None else ShapeTables()
        self.cache = DynamicCache(config=model.config)
        self.cache.layers = [RowLayer() for _ in check_cacheable(model, "target")]
        self.fills: list[int] = []          # per row: committed entries in the cache (all but its pending token)
        self.row_shapes: list[tuple[int, ...]] = []        # per row: the parents of its last forward's mask
        self.fills_on_device: torch.Tensor | None = None   # [B] the same on the device, kept in step with
        #   `fills` by device ops (a forward's write positions then need no copy from the host)

    @property
    def rows(self) -> int:
        return len(self.fills)

    @property
    def capacity(self) -> int:
        buffer = self.cache.layers[0].key_buffer
        return 0 if buffer is None else buffer.shape[2]

    def _reserve(self, rows: int, slots: int, like: Sequence[DynamicLayer] | None = None) -> None:
        """Room for `rows` rows of `slots` entries: allocated once, grown by doubling. Shapes come
        from the buffers or from `like` (a row's layers); with neither (only empty prefixes so far)
        the first forward allocates."""
        allocated = self.cache.layers[0].key_buffer is not None
        # rows the buffers hold (a batch's rows are set one by one: compared with the rows set so far,
        # every new row would copy the whole cache)
        allocated_rows = self.cache.layers[0].key_buffer.shape[0] if allocated else 0
        if allocated and rows <= allocated_rows and slots <= self.capacity:
            return
        capacity = self.capacity if allocated and slots <= self.capacity else max(slots, 2 * self.capacity)
        for index, layer in enumerate(self.cache.layers):
            source = layer if allocated else (like[index] if like is not None else None)
            if source is None or source.keys is None:
                layer.wanted_capacity = max(layer.wanted_capacity, capacity)
                continue
            layer.allocate(max(rows, self.rows, allocated_rows), capacity, source.keys[:1], source.values[:1])

    def set_row(self, row: int, source_layers: Sequence[DynamicLayer], source_row: int, fill: int, room: int) -> None:
        """Row `row` (== rows: a new last row) takes the first `fill` KV entries of row `source_row`
        of `source_layers` (a prefilled verifier's cache layers, or another batch's), with room for
        `room` entries in all (prompt + new tokens + the largest forward)."""
        self._reserve(row + 1, max(room, fill), source_layers)
        for layer, source in zip(self.cache.layers, source_layers):
            if fill and layer.key_buffer is not None:
                keys, values = (source.key_buffer, source.value_buffer) if isinstance(source, RowLayer) \
                    else (source.keys, source.values)
                layer.key_buffer[row, :, :fill] = keys[source_row, :, :fill]
                layer.value_buffer[row, :, :fill] = values[source_row, :, :fill]
        if row == self.rows:
            self.fills.append(fill)
        else:
            self.fills[row] = fill
        self._sync_fill(row)

    def _sync_fill(self, row: int) -> None:
        """fills_on_device[row] = fills[row], grown to the rows there are (a fill with a Python scalar:
        a kernel argument, no copy)."""
        device = self.model.device
        if self.fills_on_device is None or len(self.fills_on_device) < self.rows:
            grown = torch.zeros(self.rows, dtype=torch.long, device=device)
            if self.fills_on_device is not None:
                grown[: len(self.fills_on_device)] = self.fills_on_device
            self.fills_on_device = grown
        self.fills_on_device[row] = self.fills[row]

    def prefill(self, prompts: Sequence[Sequence[int]], layers: Sequence[int] | None, chunk: int,
                room: int) -> list[torch.Tensor | None]:
        """Prefill an empty batch with `prompts` (each a row's committed tokens but its pending one),
        all rows in one forward per chunk of `chunk` tokens (a row whose prompt is done pads that
        forward with one throw-away entry after its fill); each row's features [len, F] (None
        without layers or for an empty prompt). Room for `room` entries per row."""
        return [row.hidden for row in self.prefill_outputs(prompts, layers, chunk, room)]

    @torch.inference_mode()
    def prefill_outputs(self, prompts: Sequence[Sequence[int]], layers: Sequence[int] | None, chunk: int,
                        room: int, top_k: int = 0) -> list[Prefilled]:
        """prefill(), with each row's top-k next tokens after every prefilled token when top_k > 0
        (Prefilled.top_ids [len, k]; the chunks' logits are then computed on every row)."""
        self.fills = [0] * len(prompts)
        self.fills_on_device = torch.zeros(len(prompts), dtype=torch.long, device=self.model.device)
        self._reserve(len(prompts), room)
        hidden: list[list[torch.Tensor]] = [[] for _ in prompts]
        top: list[list[torch.Tensor]] = [[] for _ in prompts]
        for start in range(0, max(len(p) for p in prompts), chunk):
            pieces = [list(p[start: start + chunk]) for p in prompts]
            trees = [CandidateTree.chain(torch.tensor(piece[1:], dtype=torch.long)) for piece in pieces]
            logits, features = self.forward([piece[0] if piece else 0 for piece in pieces], trees, layers,
                                            logits_to_keep=0 if top_k else 1, prefill=True)
            for row, piece in enumerate(pieces):
                if piece:
                    self.commit(row, list(range(len(piece))))
                    if features is not None:
                        hidden[row].append(features[row, :len(piece)])                       # [C, F]
                    if top_k:
                        top[row].append(top_k_ids(logits[row, :len(piece)], top_k))         # [C, k]
        return [Prefilled(torch.cat(parts) if parts else None, torch.cat(ids) if ids else None)
                for parts, ids in zip(hidden, top)]

    def drop_rows(self, done: Sequence[int]) -> list[int]:
        """Drop the rows `done` (the batch shrinks as prompts run out) and return the old row of each
        row left, in its new order. The last rows move into the freed slots (each copies its own
        filled entries only) and the buffers are cut to the rows left (a view): dropping a row costs
        one row's copy, not a copy of the whole batch's cache at every finished prompt."""
        done = set(done)
        left = self.rows - len(done)
        order = list(range(left))
        movers = [row for row in range(left, self.rows) if row not in done]    # rows past the end, kept
        for slot, row in zip((r for r in range(left) if r in done), movers):
            order[slot] = row
            fill = self.fills[row]
            for layer in self.cache.layers:
                layer.key_buffer[slot, :, :fill] = layer.key_buffer[row, :, :fill]
                layer.value_buffer[slot, :, :fill] = layer.value_buffer[row, :, :fill]
        for layer in self.cache.layers:
            layer.key_buffer, layer.value_buffer = layer.key_buffer[:left], layer.value_buffer[:left]
        self.fills = [self.fills[row] for row in order]
        if self.fills_on_device is not None:      # the same rows moved, on the device
            self.fills_on_device = self.fills_on_device.index_select(
                0, host_to_device(order, self.model.device))
        return order

    @torch.inference_mode()
    def forward(self, pending: Sequence[int | torch.Tensor], trees: Sequence[CandidateTree],
                layers: Sequence[int] | None, logits_to_keep: int = 0,
                prefill: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [B, R, V], features [B, R, F] or None) for every row's [pending] + tree, padded to
        R = 1 + the largest tree (logits_to_keep=k: the last k rows' logits only). A row's pending
        token: an int, or [1] on the device (its last verdict's: no copy from the host). prefill: every
        tree is a chain of prompt tokens, whose masks are computed with no table (a chunk's length, new
        with every prompt, would otherwise make one)."""
        device, dtype = self.model.device, self.model.dtype
        width_rows = 1 + max(tree.num_nodes for tree in trees)
        self._reserve(self.rows, max(self.fills) + width_rows)
        width = max(self.fills) + width_rows
        input_ids = torch.zeros(self.rows, width_rows, dtype=torch.long, device=device)  # [B, R]
        masks, positions = [], []
        self.row_shapes: list[tuple[int, ...]] = []      # per row: the parents its mask's tables came from
        for row, (token, tree, fill) in enumerate(zip(pending, trees, self.fills)):
            if isinstance(token, torch.Tensor):
                input_ids[row, :1] = token
            else:
                input_ids[row, 0] = token           # a Python scalar: a kernel argument, no copy
            input_ids[row, 1: 1 + tree.num_nodes] = tree.tokens.to(device)
            parents = padded_parents(with_pending_root(tree.parents), width_rows)
            self.row_shapes.append(parents)
            if prefill:
                if not tree.is_chain:
                    raise ValueError("BatchVerifier.forward(prefill=True) feeds chains of prompt tokens, got a tree")
                length = 1 + tree.num_nodes
                masks.append(chain_masks(self.layout, length, width_rows, fill, dtype, device, capacity=width))
                positions.append(chain_position_ids(length, width_rows, fill, device))                # [1, R]
            else:
                masks.append(tree_masks(self.layout, parents, fill, dtype, device, capacity=width, tables=self.tables))
                positions.append(tree_position_ids(parents, fill, device, self.tables))  # [1, R]
        if isinstance(masks[0], dict):
            mask = {kind: torch.cat([m[kind] for m in masks]) for kind in masks[0]}     # [B, 1, R, K] per kind
        else:
            mask = torch.cat(masks)                                                        # [B, 1, R, K]
        write_at = self.fills_on_device                                                    # [B]
        for layer in self.cache.layers:
            layer.write_at, layer.width = write_at, width
        twin = self.packed or (not prefill and input_ids.numel() <= self.row_linear)
        out = (self.row_model if twin else self.model)(
            input_ids=input_ids, attention_mask=mask, position_ids=torch.cat(positions),
            **cache_kwargs(self.model, self.cache), use_cache=True, logits_to_keep=logits_to_keep,
            output_hidden_states=hidden_request(layers))
        hidden = None if layers is None else torch.cat([out.hidden_states[i] for i in layers], dim=-1)
        return out.logits, hidden

    def commit(self, row: int, kept_rows: Sequence[int], kept_on_device: torch.Tensor | None = None) -> None:
        """Keep rows `kept_rows` of row `row`'s last forward (0 = its pending token) after its fill.
        kept_on_device: the same rows [K] on the device (None: they are 0..K-1, a leading run)."""
        fill = self.fills[row]
        if kept_on_device is None and list(kept_rows) == list(range(len(kept_rows))):
            pass                                    # in place already: only the fill moves
        else:
            if kept_on_device is None:
                kept_on_device = host_to_device(list(kept_rows), self.model.device)
            slots = kept_on_device.to(self.model.device) + fill                               # [K]
            for layer in self.cache.layers:
                layer.keep(row, fill, slots)
        self.fills[row] = fill + len(kept_rows)
        self.fills_on_device[row] += len(kept_rows)


@dataclass
class Job:
    """One prompt of a batch call and everything its Decoding needs, built by the Speculator."""
    index: int
    prompt_ids: list[int]
    start: Callable[..., Decoding]  # (prompt features, stats, prompt_top_ids=None) -> its Decoding
    room: int                       # cache entries it may need: prompt + new tokens + the largest forward
    stats: Stats = field(default_factory=Stats)
    cancelled: bool = False         # set from any thread: the row leaves the batch after the step it is in
    #                                 (reported with finish reason "cancelled"); a waiting job never starts


@dataclass
class _Slot:
    job: Job
    decoding: Decoding


def decode_batch(verifier: Verifier, strategy, jobs: Sequence[Job] | deque, batch_size: int,
                 clock: Callable[[], float]) -> Iterator[list[tuple[int, list[int], str | None]]]:
    """Yield, once per batched target forward, (job index, new tokens, finish reason or None) of
    every row; at most `batch_size` rows run at once, a finished row's slot taken by the next
    waiting job. `jobs` given as a deque is the live queue itself: jobs appended to it (from any
    thread) while the batch runs join it between steps (a server's continuous batching); the
    generator ends when the queue and the batch are both empty. A job whose `cancelled` is set
    leaves the batch after the step it is in (finish reason "cancelled"), or never starts."""
    layers = feature_layers(strategy)
    batch = BatchVerifier(verifier.model, verifier.layout, verifier.tables, verifier.row_model, verifier.row_linear)
    waiting = jobs if isinstance(jobs, deque) else deque(jobs)
    active: list[_Slot] = []
    draft_batches: dict = {}          # batch key -> the rows' batched drafter state (propose_rows)
    setup_s = 0.0                     # seconds spent starting prompts so far (DecodeState.batch_setup_s)

    def take(count: int) -> list[Job]:
        """Up to `count` next waiting jobs, the cancelled ones dropped."""
        group = []
        while waiting and len(group) < count:
            job = waiting.popleft()
            if not job.cancelled:
                group.append(job)
        return group

    def start(rows: list[int], group: list[Job]) -> None:
        """The jobs `group` in slots `rows`: their prompts prefilled together (one forward per
        chunk for all of them, in a batch of their own), then copied into the running batch."""
        nonlocal setup_s
        started = clock()
        fresh = BatchVerifier(verifier.model, verifier.layout, verifier.tables)    # chains: no table made
        # prefill_chunk bounds the tokens of one prefill forward for the whole group, as for one prompt
        per_row = max(1, verifier.prefill_chunk // len(group))
        prefilled = fresh.prefill_outputs([job.prompt_ids[:-1] for job in group], layers, per_row,
                                          max(job.room for job in group), prefill_top_k(strategy))
        share = (clock() - started) / len(group)
        # the group's pending tokens in one copy; from then on each row's stays on the device (its verdicts')
        pending = to_device(torch.tensor([job.prompt_ids[-1] for job in group], dtype=torch.long), verifier.device)
        batch._reserve(max(rows) + 1, max(job.room for job in group), fresh.cache.layers)   # all of them at once
        for i, (row, job) in enumerate(zip(rows, group)):
            job.stats.prefill_time_s = share
            batch.set_row(row, fresh.cache.layers, i, fresh.fills[i], job.room)
            slot = _Slot(job, job.start(prefilled[i].hidden, job.stats, prompt_top_ids=prefilled[i].top_ids))
            slot.decoding.pending = pending[i: i + 1]
            slot.decoding.tables = batch.tables     # its commits and acceptance read the batch forward's tables
            if row == len(active):
                active.append(slot)
            else:
                active[row] = slot
        if verifier.device.type == "cuda":
            # the prefill is queued, not done: wait for it here, or the next step's verdict read would
            # wait for it and charge it to that step (auto's batch gate leaves setup_s out of a step)
            torch.cuda.synchronize(verifier.device)
        setup_s += clock() - started

    while waiting or active:
        if waiting and len(active) < batch_size:
            group = take(batch_size - len(active))
            if group:
                start(list(range(len(active), len(active) + len(group))), group)
        if not active:                  # every waiting job was cancelled
            continue
        for slot in active:
            slot.decoding.state.batch_size = len(active)
            slot.decoding.state.batch_setup_s = setup_s
            slot.decoding.state.batch_waiting = len(waiting)
        trees = propose_rows([slot.decoding for slot in active], draft_batches, clock)
        t1 = clock()
        logits, hidden = batch.forward([slot.decoding.pending_token() for slot in active], trees, layers)
        verify_s = (clock() - t1) / len(active)             # each row's share of the forward
        step, finished = [], []
        verdicts = batch_verdicts([slot.decoding for slot in active], trees, logits)   # one read (two: rejection)
        for row, (slot, tree) in enumerate(zip(active, trees)):
            rows = 1 + tree.num_nodes
            run, reason = slot.decoding.settle(tree, logits[row, :rows], None if hidden is None else hidden[row, :rows],
                                               verify_s, lambda kept, on_device, row=row: batch.commit(row, kept, on_device),
                                               verdicts[row], batch.row_shapes[row])
            if reason is None and slot.job.cancelled:
                reason = "cancelled"
            step.append((slot.job.index, run, reason))
            if reason is not None:
                finished.append(row)
        yield step
        for row in finished:
            release_drafter(active[row].decoding.strategy, draft_batches)
        group = take(len(finished))
        refill, done = finished[:len(group)], finished[len(group):]   # the next prompts take freed slots
        if refill:
            start(refill, group)
        if done:
            active = [active[row] for row in batch.drop_rows(done)]


def propose_rows(decodings: Sequence[Decoding], draft_batches: dict, clock: Callable[[], float]) -> list[CandidateTree]:
    """Every row's tree. A row whose strategy drafts with a batch drafter proposes in two phases
    (propose_start: does it call the drafter this step; propose_end: its tree from the drafter's), and
    the drafters of all rows that call one run together: ONE propose_many per draft model for the
    batch (one draft forward per chain position for all rows, not one per row); each row is charged
    its share of that time. Other rows propose on their own."""
    trees: list = [None] * len(decodings)
    groups: dict = {}
    for row, decoding in enumerate(decodings):
        drafter = decoding.strategy.batch_drafter()      # a BatchDrafter, or None: the row drafts alone
        if drafter is None:
            trees[row] = decoding.propose()
        elif decoding.propose_start():
            groups.setdefault(drafter.batch_key(), []).append((row, drafter))
        else:
            trees[row] = decoding.propose_end(None, None)
    for key, members in groups.items():
        drafters = [drafter for _, drafter in members]
        if key not in draft_batches:
            draft_batches[key] = drafters[0].new_batch()
        started = clock()
        drafted = drafters[0].propose_many(drafters, [decodings[row].state for row, _ in members], draft_batches[key])
        share = (clock() - started) / len(members)
        for (row, _), tree in zip(members, drafted):
            trees[row] = decodings[row].propose_end(tree, share)
    # one forward for all rows is as wide as the widest tree: a strategy that plans per row may cut the
    # trees to the width that pays for the whole batch (auto: strategies/batch_width.py)
    if len(decodings) > 1:
        trees = decodings[0].strategy.fit_batch([decoding.strategy for decoding in decodings], trees)
    return trees


def release_drafter(strategy, draft_batches: dict) -> None:
    """A finished row's batch drafter gives back its row of the batched draft state (if it had one)."""
    drafter = strategy.batch_drafter()
    if drafter is not None and drafter.batch_key() in draft_batches:
        draft_batches[drafter.batch_key()].release(drafter)


def read_walks(trees: Sequence[CandidateTree], targets: Sequence[tuple]) -> list[list[int] | None]:
    """Every greedy / coupled row's acceptance values (acceptance.walk_values: tree tokens, then the
    target's tokens) in one host read for the whole batch; None for a rejection-sampling row."""
    return _read_together([None if tokens is None else walk_values(tree, tokens)
                           for tree, (_, tokens) in zip(trees, targets)])


def _read_together(parts: Sequence[torch.Tensor | None]) -> list[list | None]:
    """part.tolist() of every part (None stays None), in one host read for all of them."""
    present = [part for part in parts if part is not None]
    if not present:
        return [None] * len(parts)
    dtype = torch.float64 if any(part.is_floating_point() for part in present) else torch.long
    flat = torch.cat([part.to(dtype) for part in present]).tolist()              # the one read
    values, start = [], 0
    for part in parts:
        if part is None:
            values.append(None)
        else:
            values.append(flat[start: start + len(part)])
            start += len(part)
    return values


def batch_verdicts(decodings: Sequence[Decoding], trees: Sequence[CandidateTree], logits: torch.Tensor) -> list:
    """Every row's verdict on its tree from the batch's logits [B, R, V], with the host reads of the
    whole batch shared: one read for the greedy / coupled rows (their walks' values); for the
    rejection-sampling rows one read of every row's tables and uniforms, then one of every row's
    drawn token (each drawn on the device from that row's own random stream)."""
    targets = [decoding.target_rows(tree, logits[row, :1 + tree.num_nodes])
               for row, (decoding, tree) in enumerate(zip(decodings, trees))]
    values = read_walks(trees, targets)
    verdicts: list = [None if tokens is None else accept_greedy(tree, tokens, row_values)
                      for tree, (_, tokens), row_values in zip(trees, targets, values)]
    sampled = [row for row, verdict in enumerate(verdicts) if verdict is None]
    if not sampled:
        return verdicts
    probs = {row: logits_to_probs(targets[row][0], decodings[row].sampling) for row in sampled}
    starts = {row: rejection_start(trees[row], probs[row], decodings[row].rng, decodings[row].tables)
              for row in sampled if trees[row].num_nodes}
    tables = _read_together([starts[row].values if row in starts else None for row in sampled])   # read 1
    walks, draws = {}, []
    for row, row_values in zip(sampled, tables):
        if row in starts:
            accepted, final, tokens = rejection_walk(starts[row], decodings[row].rng, row_values)
        else:                                                     # an empty tree: the target's own draw
            accepted, final, tokens = [], probs[row][0], ()
        walks[row] = (accepted, tokens)
        draws.append(decodings[row].rng.draw(final))                                   # [1] on the device
    drawn = _read_together(draws)                                                       # read 2
    for row, draw, token in zip(sampled, draws, drawn):
        accepted, tokens = walks[row]
        verdicts[row] = Verdict(tuple(accepted), int(token[0]), tokens, draw)
    return verdicts


def batch_output(outputs: list[GenerationOutput], wall_s: float, forwards: int) -> "BatchOutput":
    totals = Stats(new_tokens=sum(o.stats.new_tokens for o in outputs), target_forwards=forwards,
                   proposed_nodes=sum(o.stats.proposed_nodes for o in outputs), total_time_s=wall_s)
    for out in outputs:
        totals.accepted_lengths.extend(out.stats.accepted_lengths)
    return BatchOutput(outputs, totals)


class BatchOutput(list):
    """generate(list of prompts)'s result: one GenerationOutput per prompt, in order; `.stats` holds
    the batch's totals (new tokens of all rows, batched target forwards, the call's wall time)."""

    def __init__(self, outputs: list[GenerationOutput], stats: Stats):
        super().__init__(outputs)
        self.stats = stats
