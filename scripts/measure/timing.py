"""The timing loop the measure scripts share: a call's seconds, the median of rounds of many calls."""
from __future__ import annotations

import statistics
import time


def median_seconds(call, calls: int, rounds: int, warmup: int = 0) -> float:
    """Seconds per call of `call()`: `warmup` calls untimed, then the median over `rounds` rounds of
    `calls` calls each."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)
