"""How many levels `auto`'s drafter samples when the rejection sampler verifies: chosen before the draw.

A drafter's sampled nodes are verified whole (auto's planner cannot cut them after their draw: which
nodes stay would then depend on the drawn tokens and bias the law), so their depth is the one size the
planner has at temperature > 0, and it must be set before the drafter runs. The choice uses past steps
only, so a tree's shape never depends on its own draws and the law holds.

Depth d is priced as expected new tokens over the seconds of a whole step at that depth:

* tokens: 1 + sum over levels j <= d of a_1 ... a_j, a_j the calibrated acceptance at level j given
  the level above was kept (auto's Calibrator, per depth);
* seconds: anchored on measured steps. The wall time of recent steps at some depth D (everything a
  step costs: the verify forward, every row's drafting, acceptance, the batch's bookkeeping), plus
  what the verify profile says d's nodes cost beyond D's, plus (d - D) levels of drafting. A call's
  drafting is counted as levels + 1 equal parts: the catch-up forward and one forward and draw per
  level.

Alone, a level costs little (the forward is memory-bound: a deep tree is verified nearly as fast as a
shallow one) and the drafter's whole depth pays. In a batch the forward is compute-bound: every
level costs every row a node of the forward and a drafter forward, and a shallower tree can pay more.
The measured times are kept per batch-size bucket (a power of two) and temperature kind, shared by
the rows and calls of one `Auto` (each row drafts with a copy of it).
"""
from __future__ import annotations

import statistics
import threading
from collections import deque
from typing import Callable

MEMORY = 9           # recent samples whose median is a time (one stalled step must not decide)
MIN_SAMPLES = 3      # steps measured at a depth before it anchors the prices


def bucket_of(batch_size: int) -> int:
    """The power of two at or above batch_size (the cost profile's buckets)."""
    return 1 << (max(batch_size, 1) - 1).bit_length()


class SampledDepth:
    """Shared by an Auto's copies: what sampled drafting at each depth has cost, and the choice."""

    def __init__(self):
        self.levels: tuple[int, ...] = ()                     # nodes per level of the deepest sampled tree seen
        self.level_s: dict[int, deque] = {}                   # bucket -> recent seconds per level (one row's share)
        self.step_s: dict[tuple, deque] = {}                  # (bucket, temperature kind, levels) -> step wall seconds
        self.chosen: dict[tuple, list] = {}                   # (bucket, temperature kind, cap) -> [depth, uses left]
        self._lock = threading.Lock()

    def note_tree(self, depths: list[int]) -> None:
        """A sampled tree the drafter drafted (its nodes' depths, 0 = the first level): keep the nodes per
        level of the deepest one (a tree drafted under a cap is shallower and changes nothing)."""
        levels = max(depths, default=-1) + 1
        with self._lock:
            if levels >= len(self.levels):
                self.levels = tuple(depths.count(level) for level in range(levels))

    def record_drafting(self, batch_size: int, seconds: float, levels: int) -> None:
        """One row's drafting of a sampled tree of `levels` levels took `seconds` (its share of a batch's)."""
        if levels > 0 and seconds > 0:
            self._deque(self.level_s, bucket_of(batch_size)).append(seconds / (levels + 1))

    def record_step(self, batch_size: int, temperature_kind: str, levels: int, seconds: float) -> None:
        """A whole step (wall time between a row's proposals, less the batch's prefill meanwhile) whose
        drafter sampled `levels` levels."""
        if levels > 0 and seconds > 0:
            self._deque(self.step_s, (bucket_of(batch_size), temperature_kind, levels)).append(seconds)

    def _deque(self, table: dict, key) -> deque:
        with self._lock:
            return table.setdefault(key, deque(maxlen=MEMORY))

    def _anchor(self, bucket: int, temperature_kind: str) -> tuple[int, float] | None:
        """(levels, median step seconds) of the depth measured most at this bucket (ties: the deeper)."""
        with self._lock:
            measured = [(len(times), key[2], list(times)) for key, times in self.step_s.items()
                        if key[:2] == (bucket, temperature_kind) and len(times) >= MIN_SAMPLES]
        if not measured:
            return None
        _, levels, times = max(measured, key=lambda item: (item[0], item[1]))
        return levels, statistics.median(times)

    def choose(self, batch_size: int, temperature_kind: str, max_depth: int, accept: Callable[[int], float],
               verify_s: Callable[[int], float]) -> int | None:
        """The depth (levels, 1..) that makes the most tokens per second, None before enough is measured.
        accept(j): the calibrated acceptance at level j (1 = the first); verify_s(n): seconds of a verify
        forward of this batch with n tree nodes per row (the cost profile; differences only are used)."""
        bucket = bucket_of(batch_size)
        key = (bucket, temperature_kind, max_depth)
        with self._lock:     # once per batch step: every row of a step drafts as deep (the forward is the widest row's)
            chosen = self.chosen.get(key)
            if chosen is not None and chosen[1] > 0:
                chosen[1] -= 1
                return chosen[0]
        depth = self._best_depth(batch_size, bucket, temperature_kind, max_depth, accept, verify_s)
        with self._lock:
            self.chosen[key] = [depth, batch_size - 1]
        return depth

    def _best_depth(self, batch_size: int, bucket: int, temperature_kind: str, max_depth: int,
                    accept: Callable[[int], float], verify_s: Callable[[int], float]) -> int | None:
        anchor = self._anchor(bucket, temperature_kind)
        with self._lock:
            widths, level_times = self.levels, list(self.level_s.get(bucket, ()))
        if anchor is None or not widths or not level_times:
            return None
        anchor_levels, anchor_s = anchor
        level_s = statistics.median(level_times) * batch_size     # a level of the whole batch's drafting
        nodes = [sum(widths[:levels]) for levels in range(len(widths) + 1)]
        anchor_levels = min(anchor_levels, len(widths))
        reach, expected = 1.0, 1.0
        best_depth, best_rate = None, 0.0
        for depth in range(1, min(len(widths), max_depth) + 1):
            reach *= accept(depth)
            expected += reach
            seconds = (anchor_s + verify_s(nodes[depth]) - verify_s(nodes[anchor_levels])
                       + (depth - anchor_levels) * level_s)
            if seconds <= 0:
                continue
            rate = expected / seconds
            if rate > best_rate:
                best_depth, best_rate = depth, rate
        return best_depth
