"""How wide a batch's verify forward is: one width for all rows, chosen for the whole batch.

A batch's forward is [B, 1 + the widest row's tree] (specdec.batch): every row pays for the widest
tree, so the width is the batch's choice, not a row's. Each row plans its own tree with its share of
the verify cost (auto's planner: v_B(n) / B, which prices a node as if only its own row paid
for it), then the batch cuts every tree to the width that makes the most expected new tokens per
second of the step:

    width* = argmax_w  sum_r (1 + sum of the reach of row r's w best nodes) / (F(w) + D)

where F(w) is the batch forward of w nodes a row (the cost profile measured for this batch size,
scaled by the step times observed since), D the step's drafting (already spent, but part of the
step the width is chosen for), and a row's nodes are cut in reach order (the order in which its
planner took them: every cut keeps a tree closed under parents). A row's sampled nodes (rejection
sampling: verified whole or not drafted) are never cut, so the width is at least the largest of
them. At B = 1 the row's own plan already is this choice.

Cutting nodes is lossless as the planner's own choice is: the dropped nodes are point masses
(greedy, coupled, prompt lookup), and the step keeps what the target would have produced.
"""
from __future__ import annotations

from typing import Callable, Sequence


def best_width(reaches: Sequence[Sequence[float]], forced: Sequence[int], forward_s: Callable[[int], float],
               fixed_s: float) -> int:
    """The width (nodes a row) with the most expected new tokens per second over all rows.
    reaches: per row, its kept nodes' reach in cut order; forced: per row, how many of its first nodes
    cannot be cut; forward_s(w): seconds of the batch's forward at width w; fixed_s: the step's other
    seconds."""
    floor = max(forced, default=0)          # every width tried keeps every row's forced nodes
    widest = max((len(r) for r in reaches), default=0)
    best, best_rate = widest, -1.0
    for width in range(floor, widest + 1):
        tokens = sum(1.0 + sum(reach[:width]) for reach in reaches)
        rate = tokens / (forward_s(width) + fixed_s)
        if rate > best_rate:
            best, best_rate = width, rate
    return best
