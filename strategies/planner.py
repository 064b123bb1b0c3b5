"""The planner behind `auto`: which prefix-closed part of a candidate tree to verify this step.

Each node i carries an acceptance estimate a_i: the probability that the target keeps it given that
its parent was kept (its draft confidence, calibrated online by `Calibrator`). The probability that
the whole path to i is kept is reach_i = prod of a along the path, and the expected number of new
tokens of a tree S is 1 + sum_{i in S} reach_i (the +1 is the target's own token after the path).
The planner picks the S that maximises (1 + sum reach) / (verify_cost(|S|) + draft_cost); S = {}
(plain decoding) when no tree pays for its forward. Nodes a drafter sampled (rejection sampling)
are `forced`: verified whole or not drafted (see strategies/auto.py), the rest is planned around them.

For a fixed size n the best S is the n nodes of largest reach (reach never grows down a path, so
those n nodes are closed under parents when ties go to the lower index: a parent comes first);
the planner scans n = 0..N. tests/test_planner.py checks it against brute force.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Callable, Iterable, Sequence


def path_reach(parents: Sequence[int], accept: Sequence[float]) -> list[float]:
    """[N] probability that the path to each node is kept: the product of `accept` along it."""
    reach: list[float] = []
    for i, p in enumerate(parents):
        reach.append(accept[i] * (1.0 if p == -1 else reach[p]))
    return reach


def plan(parents: Sequence[int], accept: Sequence[float], verify_cost: Callable[[int], float],
         draft_cost: float = 0.0, max_nodes: int | None = None, forced: Iterable[int] = (),
         chain: bool = False) -> tuple[list[int], float]:
    """(nodes to keep in index order, expected new tokens per unit of cost) of the best prefix-closed
    subset of at most max_nodes nodes that contains `forced` (itself closed under parents; it may
    exceed max_nodes). verify_cost(n): cost of verifying n nodes (n = 0: a plain decoding step).
    accept: [N] values in [0, 1]. chain: the subset must be one path from the root (plan_chain)."""
    if chain:
        return plan_chain(parents, accept, verify_cost, draft_cost, max_nodes, forced)
    reach = path_reach(parents, accept)
    forced = sorted(set(forced))
    chosen = set(forced)
    order = sorted((i for i in range(len(parents)) if i not in chosen), key=lambda i: (-reach[i], i))
    limit = len(order) if max_nodes is None else max(0, min(len(order), max_nodes - len(forced)))
    expected = 1.0 + sum(reach[i] for i in forced)
    best_n, best_rate = 0, expected / (verify_cost(len(forced)) + draft_cost)
    for n in range(1, limit + 1):
        expected += reach[order[n - 1]]
        rate = expected / (verify_cost(len(forced) + n) + draft_cost)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return sorted(forced + order[:best_n]), best_rate


def plan_chain(parents: Sequence[int], accept: Sequence[float], verify_cost: Callable[[int], float],
               draft_cost: float = 0.0, max_nodes: int | None = None, forced: Iterable[int] = ()
               ) -> tuple[list[int], float]:
    """plan() restricted to chains, for a target verified on chains (linear-attention layers: one recurrent
    state follows one path): the best path from the root, or none. Every node ends one path, whose expected
    new tokens are 1 + the reach along it; `forced` nodes must lie on the path kept (forced nodes that are not
    one path cannot be verified: then the best is plain decoding, nothing kept)."""
    reach = path_reach(parents, accept)
    forced = set(forced)
    limit = max(len(parents) if max_nodes is None else max_nodes, len(forced))
    plain = 1.0 / (verify_cost(0) + draft_cost)
    best_end, best_rate = -1, (0.0 if forced else plain)
    # per node i, of the path from the root down to it: its length, its reach summed, its forced nodes
    length: list[int] = []
    gained: list[float] = []
    holds: list[int] = []
    for i, p in enumerate(parents):
        above = (0, 0.0, 0) if p == -1 else (length[p], gained[p], holds[p])
        length.append(above[0] + 1)
        gained.append(above[1] + reach[i])
        holds.append(above[2] + (i in forced))
        if length[i] > limit or holds[i] < len(forced):
            continue
        rate = (1.0 + gained[i]) / (verify_cost(length[i]) + draft_cost)
        if rate > best_rate:
            best_end, best_rate = i, rate
    if best_end == -1:                        # plain decoding; with forced nodes off every path, verify none
        return [], plain
    path = []
    while best_end != -1:
        path.append(best_end)
        best_end = parents[best_end]
    return path[::-1], best_rate


def confidence_bucket(confidence: float, buckets: int) -> int:
    """Bucket of a draft probability in [0, 1]: equal-width buckets (the last one holds 1.0)."""
    return min(int(max(confidence, 0.0) * buckets), buckets - 1)


def temperature_key(temperature: float) -> str:
    """Calibration is kept apart per temperature: greedy, low (< 0.5), mid (< 1), high."""
    if temperature == 0:
        return "greedy"
    return "low" if temperature < 0.5 else "mid" if temperature < 1.0 else "high"


class Calibrator:
    """Observed acceptance per (drafter, temperature, confidence bucket): a node's calibrated
    estimate is the kept fraction of the nodes in its bucket whose parent was kept, smoothed
    towards the raw confidence by `prior` pseudo-observations. Nodes without a draft probability
    (prompt lookup; greedy drafters that hand over tokens only) are bucketed by depth instead.
    Older observations fade (`decay` per new one in the same bucket: a memory of about
    1 / (1 - decay) of them), so the estimates follow the text: lookup pays on one prompt, not the next."""

    def __init__(self, buckets: int = 10, prior: float = 4.0, max_depth_key: int = 8, decay: float = 0.98):
        self.buckets = buckets
        self.prior = prior
        self.decay = decay
        self.max_depth_key = max_depth_key
        self.kept: dict[tuple, float] = defaultdict(float)
        self.tried: dict[tuple, float] = defaultdict(float)
        self._lock = threading.Lock()

    def key(self, source: str, temperature: float, confidence: float | None, depth: int) -> tuple:
        if confidence is None:
            return source, temperature_key(temperature), "depth", min(depth, self.max_depth_key)
        return source, temperature_key(temperature), "conf", confidence_bucket(confidence, self.buckets)

    def estimate(self, key: tuple, confidence: float | None, default: float) -> float:
        """Calibrated probability of being kept given the parent was."""
        raw = default if confidence is None else confidence
        with self._lock:                    # kept and tried of one record, never half of one
            kept, tried = self.kept[key], self.tried[key]
        return (kept + self.prior * raw) / (tried + self.prior)

    def record(self, key: tuple, kept: bool) -> None:
        with self._lock:    # shared by the calls of a Speculator (and by Speculators sharing a strategy)
            self.tried[key] = self.decay * self.tried[key] + 1.0
            self.kept[key] = self.decay * self.kept[key] + (1.0 if kept else 0.0)
