"""token_recycling: the target drafts from its own earlier predictions, with no training (Luo et al.
2024, "Turning Trash into Treasure").

One integer table, `vocab x k`: row t holds the target's top-k next tokens the last time it read
token t. After every verify forward, every row of that forward - the pending token's and every tree
node's, accepted or not - overwrites its token's row with the top-k the target computed there
(StepResult.top_ids, asked for with top_k_ids = k: one scatter on the device). A call's prefill
seeds the rows of its prompt's tokens the same way (DecodeState.prompt_top_ids).

The draft is a tree filled breadth first from the table: a node at child rank r of a parent holding
token t holds table[t, r]. Its shape (which ranks, how deep) is not a fixed template: the shape
planner takes the rank paths by their estimated probability of being kept (the product, down the
path, of the kept rate of each depth and rank, calibrated online from the verdicts) and keeps the
prefix-closed set with the most expected new tokens per second of verify on this machine
(strategies/planner.plan over the verify costs of specdec/costmodel.py, as auto sizes its trees);
nothing when no tree pays. The shape is planned again every `replan_every` steps, so the tree's
tensors (its mask, the gather indices) are built once per shape, not per step.

Everything per step runs on the device: the draft is one gather per level from the table, the
update one scatter; the step's one host read is the engine's (the tree's tokens come back with the
target's in acceptance). A CPU's table is read on the host instead (draft_tokens): no sync there.
Proposals are point masses: lossless under every sampler.

Scoping: the table persists across calls as suffix's cache does - per Speculator, one table per
cache scope, never read across scopes. A call drafts from its own copy of its scope's table, taken
at reset, and hands it back when it finishes, so a call's drafts never depend on how concurrent
calls interleave.
"""
from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from specdec.config import setting
from specdec.costmodel import CostProfile, batch_costs, planning_costs, profile_sizes
from specdec.errors import ConfigError
from specdec.models import output_vocab_size, verified_on_chains
from specdec.tree import CandidateTree, host_to_device
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy
from .planner import Calibrator, plan, temperature_key


@dataclass
class TokenRecyclingConfig:
    """The `token_recycling:` section: the table's width and the bounds of the trees the shape planner
    may choose (strategies/token_recycling.py)."""
    k: int = setting(8, min=1)                   # top-k tokens kept per table row (the paper's 8)
    max_nodes: int = setting(32, min=0)          # the planner's ceiling on tree nodes per step
    max_depth: int = setting(8, min=1)           # the deepest tree level the planner considers
    replan_every: int = setting(16, min=1)       # steps between two shape plans (each new shape builds its tables)
    profile: bool = True                         # measure (or read the cached) verify costs at load; false: a guess
    profile_context: int = setting(128, min=1)   # context length of the measurement
    profile_repeats: int = setting(5, min=1)     # rounds over every tree size; the median of each is kept
    scope: str = "default"                       # table scope of calls that pass no cache_scope


CONFIG_SECTIONS = {"token_recycling": TokenRecyclingConfig}

# kept rate of a node at child rank r before calibration (greedy, sampled): a target's second choice
# is the next token far less often than its first
PRIOR_FIRST = {"greedy": 0.6, "sampled": 0.3}
SHAPES_KEPT = 64          # tree shapes whose device tensors are kept (shared by a Speculator's calls)


def prior_accept(rank: int, greedy: bool) -> float:
    return PRIOR_FIRST["greedy" if greedy else "sampled"] / (1 + rank) ** 2


# ---------------------------------------------------------------------- the table
def recycle(table: torch.Tensor, input_ids: torch.Tensor, top_ids: torch.Tensor) -> None:
    """table[input_ids[i]] = top_ids[i] for every row i, in place, on the table's device. A token that
    several rows hold takes the last of those rows (so the result does not depend on the order a
    device writes duplicates in). table [V, k]; input_ids [R]; top_ids [R, >= k]."""
    rows = input_ids.shape[0]
    positions = torch.arange(rows, device=table.device)
    last = torch.full((table.shape[0],), -1, dtype=torch.long, device=table.device)        # [V]
    last.scatter_reduce_(0, input_ids, positions, reduce="amax")
    table[input_ids] = top_ids[last[input_ids], : table.shape[1]]                          # [R, k]


class TableStore:
    """The tables that persist across calls, one per cache scope (suffix's scoping); shared by
    reference by a Speculator's calls, changed under its lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.scopes: dict[str, torch.Tensor] = {}

    def checkout(self, scope: str, rows: int, k: int, device) -> torch.Tensor:
        """A call's own copy of its scope's table ([rows, k] zeros for a scope seen for the first time)."""
        with self.lock:
            table = self.scopes.get(scope)
            if table is None or table.shape != (rows, k) or table.device != torch.device(device):
                return torch.zeros(rows, k, dtype=torch.long, device=device)
            return table.clone()

    def checkin(self, scope: str, table: torch.Tensor) -> None:
        """A finished call's table becomes its scope's."""
        with self.lock:
            self.scopes[scope] = table

    def clear(self) -> None:
        with self.lock:
            self.scopes.clear()


# ---------------------------------------------------------------------- the tree's shape
class Shape(NamedTuple):
    """A tree of table lookups, breadth first: node i hangs below parents[i] (-1: the pending token)
    and holds its parent's token's row read at ranks[i]; each level's nodes are contiguous."""
    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def depths(self) -> list[int]:
        depths: list[int] = []
        for p in self.parents:
            depths.append(0 if p == -1 else depths[p] + 1)
        return depths

    def levels(self) -> list[tuple[int, int]]:
        """(first node, end) of each level."""
        depths, bounds = self.depths(), []
        for i, d in enumerate(depths):
            if d == len(bounds):
                bounds.append((i, i + 1))
            else:
                bounds[d] = (bounds[d][0], i + 1)
        return bounds

    def cut(self, max_depth: int) -> "Shape":
        """The levels above max_depth (a breadth-first prefix)."""
        keep = sum(1 for d in self.depths() if d < max_depth)
        return Shape(self.parents[:keep], self.ranks[:keep])


def best_first(accept: Callable[[int, int], float], k: int, max_nodes: int, max_depth: int
               ) -> tuple[list[int], list[int], list[float]]:
    """(parents, ranks, kept rate) of the max_nodes rank paths of highest reach (the product of
    accept(depth, rank) down the path), in the order taken: a parent comes before its children."""
    parents: list[int] = []
    ranks: list[int] = []
    rates: list[float] = []
    heap = [(-accept(0, r), r, -1, 0, r) for r in range(k)]      # (-reach, tie, parent, depth, rank)
    heapq.heapify(heap)
    tie = k
    while heap and len(parents) < max_nodes:
        reach, _, parent, depth, rank = heapq.heappop(heap)
        node = len(parents)
        parents.append(parent)
        ranks.append(rank)
        rates.append(accept(depth, rank))
        if depth + 1 < max_depth:
            for r in range(k):
                heapq.heappush(heap, (reach * accept(depth + 1, r), tie, node, depth + 1, r))
                tie += 1
    return parents, ranks, rates


def breadth_first(parents: list[int], ranks: list[int], keep: list[int]) -> Shape:
    """The kept nodes (closed under parents) reordered level by level, each level by its parents'
    order, then by rank."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p == -1 else depth[p] + 1)
    new_index: dict[int, int] = {}
    order: list[int] = []
    for level in range(max((depth[i] for i in keep), default=-1) + 1):
        at_level = [i for i in keep if depth[i] == level]
        at_level.sort(key=lambda i: (-1 if parents[i] == -1 else new_index[parents[i]], ranks[i]))
        for i in at_level:
            new_index[i] = len(order)
            order.append(i)
    return Shape(tuple(-1 if parents[i] == -1 else new_index[parents[i]] for i in order),
                 tuple(ranks[i] for i in order))


def plan_shape(accept: Callable[[int, int], float], k: int, max_nodes: int, max_depth: int,
               verify_cost: Callable[[int], float], draft_cost: float = 0.0, chain: bool = False) -> Shape:
    """The tree shape with the most expected new tokens per second: the best prefix-closed set of the
    best-first rank paths (strategies/planner.plan; one path with `chain`), breadth first; empty when none pays."""
    parents, ranks, rates = best_first(accept, k, max_nodes, max_depth)
    keep, _ = plan(parents, rates, verify_cost, draft_cost, max_nodes, chain=chain)
    return breadth_first(parents, ranks, keep)


@dataclass(frozen=True)
class ShapeIndex:
    """One shape's gather indices on the device: node i reads row parent_rows[i] of [pending] + nodes
    at column ranks[i]."""
    parent_rows: torch.Tensor     # [N] long: parents + 1
    ranks: torch.Tensor           # [N] long
    levels: tuple[tuple[int, int], ...]
    host: tuple[tuple[int, int], ...]     # (parent_rows[i], ranks[i]) per node, on the host


def shape_index(shape: Shape, device) -> ShapeIndex:
    parent_rows = [p + 1 for p in shape.parents]
    packed = host_to_device([parent_rows, list(shape.ranks)], device)     # [2, N]: one copy
    return ShapeIndex(packed[0], packed[1], tuple(shape.levels()), tuple(zip(parent_rows, shape.ranks)))


def draft_tokens(table: torch.Tensor, pending: torch.Tensor, index: ShapeIndex) -> torch.Tensor:
    """[N] the tree's tokens: each node reads its parent's token's row of the table at its rank. A table in host
    memory (a CPU's) is read node by node on the host: there a read costs no sync, and a tree's dozen reads cost
    less than the torch calls of a gather per level. Elsewhere one gather per level, on the device."""
    if reads_on_host(table):
        rows = table.numpy()                               # [V, k], the table's own memory (no copy)
        held = [int(pending)]                              # the pending token, then each node's token
        for parent_row, rank in index.host:
            held.append(int(rows[held[parent_row], rank]))
        return host_to_device(held[1:], table.device)                  # on the host already: no copy
    return gathered_tokens(table, pending, index)


def reads_on_host(table: torch.Tensor) -> bool:
    """Whether draft_tokens reads the table on the host: where the table lies in host memory."""
    return table.device.type == "cpu"


def gathered_tokens(table: torch.Tensor, pending: torch.Tensor, index: ShapeIndex) -> torch.Tensor:
    """draft_tokens on the device: one gather per level."""
    rows = torch.empty(1 + index.parent_rows.shape[0], dtype=torch.long, device=table.device)   # [1 + N]
    rows[:1] = pending
    for start, end in index.levels:
        parent_tokens = rows[index.parent_rows[start:end]]                                      # [n]
        rows[1 + start: 1 + end] = table[parent_tokens, index.ranks[start:end]]
    return rows[1:]


# ---------------------------------------------------------------------- the strategy
class TokenRecycling(BaseStrategy):
    name = "token_recycling"
    leads_greedy = True                # auto's greedy steps call it first (BaseStrategy.leads_greedy)
    needs_hidden_states = False

    # defaults: TokenRecyclingConfig's, the one source of them
    def __init__(self, *, k: int = TokenRecyclingConfig.k, max_nodes: int = TokenRecyclingConfig.max_nodes,
                 max_depth: int = TokenRecyclingConfig.max_depth,
                 replan_every: int = TokenRecyclingConfig.replan_every, profile: bool = TokenRecyclingConfig.profile,
                 profile_context: int = TokenRecyclingConfig.profile_context,
                 profile_repeats: int = TokenRecyclingConfig.profile_repeats,
                 scope: str = TokenRecyclingConfig.scope, costs: CostProfile | None = None,
                 store: TableStore | None = None):
        for key, value, low in (("k", k, 1), ("max_nodes", max_nodes, 0), ("max_depth", max_depth, 1),
                                ("replan_every", replan_every, 1), ("profile_context", profile_context, 1),
                                ("profile_repeats", profile_repeats, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"token_recycling.{key} must be an integer >= {low}, got {value!r}")
        self.k = self.top_k_ids = k
        self.max_nodes, self.max_depth, self.replan_every = max_nodes, max_depth, replan_every
        self.profile, self.profile_context, self.profile_repeats = bool(profile), profile_context, profile_repeats
        self.default_scope = str(scope)
        self.costs = costs
        self.batch_costs: dict[int, CostProfile] = {}   # batch bucket > 1 -> its verify costs (shared by per-call copies)
        self.target = None
        self.compiled_verifier = False
        self.row_linear = 0
        # shared by a Speculator's calls (per-call copies hold the same objects): what persists and is learned
        self.store = store if store is not None else TableStore()
        self.calibrator = Calibrator()
        self.shapes: dict[Shape, ShapeIndex] = {}
        self.shapes_lock = threading.Lock()
        self.draft_cost_s = 0.0              # seconds a step's drafting adds (propose + observe), measured
        self.device = "cpu"
        self.chains = False          # the target is verified on chains (linear-attention layers): plan one path
        self.rows = 0
        self.reset_call()

    def reset_call(self) -> None:
        """Per-call state (fresh objects: a call's copy shares none of it)."""
        self.table: torch.Tensor | None = None
        self.scope = self.default_scope
        self.shape = Shape((), ())
        self.steps = 0
        self.tree_sizes: list[int] = []
        self.drafted: tuple[Shape, CandidateTree] | None = None    # the last proposal (observe calibrates it)
        self.draft_s = 0.0
        self.peeked: tuple[tuple[int, int], Shape] | None = None   # peek's plan where propose would plan anew
        self.peeks = 0

    # ------------------------------------------------------------------ set-up
    def use_compiled_verifier(self, compiled: bool) -> None:
        self.compiled_verifier = bool(compiled)

    def use_row_linear(self, rows: int) -> None:
        self.row_linear = int(rows)

    def profile_setup(self, target) -> tuple[tuple[int, ...], int]:
        """(tree sizes, context length) of the verify-cost profile the shape planner reads."""
        limit = getattr(target.config, "max_position_embeddings", None) or 4096
        return profile_sizes(self.max_nodes), max(1, min(self.profile_context, limit - self.max_nodes - 2))

    def use_costs(self, profile: CostProfile) -> None:
        self.costs = profile

    def bind(self, target, tokenizer) -> None:
        vocab = output_vocab_size(target)
        if self.k > vocab:
            raise ConfigError(f"token_recycling.k = {self.k} is larger than the target's vocabulary ({vocab} "
                              f"tokens): a table row holds the top-k of the target's logits; set k <= {vocab}")
        self.device = target.device
        self.target = target
        self.chains = verified_on_chains(target)
        self.rows = max(vocab, target.get_input_embeddings().num_embeddings)
        if self.costs is None:
            self.costs = planning_costs(target, self.profile, *self.profile_setup(target), self.profile_repeats,
                                        self.compiled_verifier, self.row_linear)

    # ------------------------------------------------------------------ protocol
    def reset(self, state: DecodeState) -> None:
        self.reset_call()
        scope = state.cache_scope
        self.scope = self.default_scope if scope is None else scope
        self.table = self.store.checkout(self.scope, self.rows, self.k, self.device)
        if state.prompt_top_ids is not None and len(state.token_ids) > 1:      # seed from the prefill
            prompt = host_to_device(state.token_ids[:-1], self.device)                   # [P - 1]
            recycle(self.table, prompt, state.prompt_top_ids.to(self.device))

    def propose(self, state: DecodeState) -> CandidateTree:
        started = time.perf_counter()
        if self.steps % self.replan_every == 0:   # a plan peek made for this step is this step's plan (peek)
            peeked = self.peeked
            self.shape = peeked[1] if peeked is not None and peeked[0][0] == self.steps else self.plan(state)
        self.steps += 1
        shape = self.shape.cut(state.max_depth)
        self.tree_sizes.append(len(shape.parents))
        tree = (CandidateTree(self._tokens(shape, state), shape.parents) if shape.parents
                else CandidateTree.empty(self.device))
        self.drafted = (shape, tree)
        self.draft_s = time.perf_counter() - started
        return tree

    def peek(self, state: DecodeState) -> tuple[list[int], tuple[int, ...]] | None:
        """(tokens, parents) of the tree propose() would draft now, on the host, changing nothing propose reads
        (no step counted; where propose would plan its shape anew, peek plans it, and propose takes that plan):
        what auto scores the table by on steps another drafter led
        (strategies/paired_leader.py). None before the call's reset. One read of the table: a host sync on a
        GPU, so auto asks only on a CPU."""
        if self.table is None:
            return None
        if self.steps % self.replan_every:
            shape = self.shape
        else:       # propose plans its shape afresh on this step: the same plan, made once while it waits (and again
            #         every replan_every peeks, as propose would, where the table is not called for a while)
            key = (self.steps, self.peeks // self.replan_every)
            if self.peeked is None or self.peeked[0] != key:
                self.peeked = (key, self.plan(state))
            self.peeks += 1
            shape = self.peeked[1]
        shape = shape.cut(state.max_depth)
        return (self._tokens(shape, state).tolist(), shape.parents) if shape.parents else ([], ())

    def _tokens(self, shape: Shape, state: DecodeState) -> torch.Tensor:
        """[N] the tokens of a non-empty `shape`, read from the table below the pending token (draft_tokens), on
        the table's device."""
        pending = state.pending if state.pending is not None else host_to_device([state.token_ids[-1]], self.device)
        return draft_tokens(self.table, pending.to(self.device), self.index(shape))

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.observe_steps(state, (result,))

    def observe_steps(self, state: DecodeState, results) -> None:
        """observe() of the steps in order, with one table write for all their rows: a token that rows of several
        steps hold takes the last of them, as it would step by step (recycle keeps the last row)."""
        started = time.perf_counter()
        rows = [result for result in results if result.top_ids is not None]
        if len(rows) == 1:
            recycle(self.table, rows[0].input_ids, rows[0].top_ids)
        elif rows:
            recycle(self.table, torch.cat([result.input_ids for result in rows]),       # [R]
                    torch.cat([result.top_ids[:, :self.k] for result in rows]))         # [R, k]
        for result in results:
            self.calibrate(result, state.sampling.temperature)
        spent, self.draft_s = self.draft_s + time.perf_counter() - started, 0.0   # a propose counts once: inside
        #                                 auto, steps that did not call the table have none
        self.draft_cost_s = 0.9 * self.draft_cost_s + 0.1 * spent if self.draft_cost_s else spent

    def finish(self, state: DecodeState) -> None:
        """The call's table becomes its scope's (the rows it learned persist to the next call)."""
        if self.table is not None:
            self.store.checkin(self.scope, self.table)

    def forget(self) -> None:
        """Drop every scope's table (a benchmark workload starting from nothing); calibration stays."""
        self.store.clear()

    # ------------------------------------------------------------------ the shape
    def accept_rate(self, depth: int, rank: int, temperature: float) -> float:
        """Estimated probability that a node at (depth, rank) is kept, given its parent was."""
        key = self.calibrator.key(f"recycle{rank}", temperature, None, depth)
        return self.calibrator.estimate(key, None, prior_accept(rank, temperature == 0))

    def costs_at(self, batch: int) -> CostProfile:
        """The verify costs for forwards of `batch` rows (specdec.costmodel.batch_costs, as auto's): in a batch
        a row's tree is sized by its share of the batch's forward, which turns compute-bound as the batch grows."""
        if batch <= 1 or not self.profile or self.target is None:
            return self.costs
        return batch_costs(self.batch_costs, self.target, batch, *self.profile_setup(self.target),
                           self.profile_repeats, self.row_linear)

    def prepare_batches(self, max_rows: int) -> None:
        """The verify costs of every batch bucket up to max_rows, now (a server's load: no batch stalls on one)."""
        self.costs_at(max_rows)

    def plan(self, state: DecodeState) -> Shape:
        temperature = state.sampling.temperature
        batch = max(1, state.batch_size)
        costs = self.costs_at(batch)
        return plan_shape(lambda depth, rank: self.accept_rate(depth, rank, temperature), self.k, self.max_nodes,
                          self.max_depth, lambda nodes: costs.verify_cost(nodes) / batch, self.draft_cost_s,
                          chain=self.chains)

    def calibrate(self, result: StepResult, temperature: float) -> None:
        """Every verified node whose parent was kept was tried: record whether it was kept, per (depth,
        rank). A node of the drafted tree that was not verified (result.verified: auto kept part of the tree)
        was not tried. Skipped when the verified tree is not the one drafted (a strategy around this one
        verified another)."""
        if self.drafted is None or result.tree is not self.drafted[1]:
            return
        shape, self.drafted = self.drafted[0], None
        kept = set(result.accepted)
        verified = None if result.verified is None else set(result.verified)
        depths = shape.depths()
        for node, parent in enumerate(shape.parents):
            if (parent == -1 or parent in kept) and (verified is None or node in verified):
                key = self.calibrator.key(f"recycle{shape.ranks[node]}", temperature, None, depths[node])
                self.calibrator.record(key, node in kept)

    def index(self, shape: Shape) -> ShapeIndex:
        """The shape's gather indices on the device, built once per shape (shared by the calls)."""
        with self.shapes_lock:
            found = self.shapes.get(shape)
            if found is None:
                if len(self.shapes) >= SHAPES_KEPT:
                    self.shapes.clear()
                found = self.shapes[shape] = shape_index(shape, self.device)
            return found


def from_config(cfg, target, tokenizer, device, dtype) -> TokenRecycling:
    c = cfg.token_recycling
    return TokenRecycling(k=c.k, max_nodes=c.max_nodes, max_depth=c.max_depth, replan_every=c.replan_every,
                          profile=c.profile, profile_context=c.profile_context, profile_repeats=c.profile_repeats,
                          scope=c.scope)
