"""The suffix sort of a REST datastore's token ids (strategies/datastore.suffix_array): its wall time and the
peak of what Python and numpy allocate while it runs (tracemalloc), per token, with the ids already in memory.

    python scripts/measure/datastore_sort_memory.py --tokens DATASTORE/tokens.bin
    python scripts/measure/datastore_sort_memory.py --synthetic 2000000     # uniform, Zipf, period-3, all-equal ids

Why: `specdec index` must fit in memory well below 8x the text's size (issue 47), and the sort's arrays are
most of what it holds (benchmarks/results/rest_index)."""
from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from specdec.strategies.datastore import suffix_array


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", help="a datastore's tokens.bin (uint32 ids)")
    parser.add_argument("--synthetic", type=int, help="instead, this many ids of four made-up distributions")
    args = parser.parse_args()
    if args.synthetic:
        rng = np.random.default_rng(0)
        n = args.synthetic
        cases = {"uniform over 50k ids": rng.integers(0, 50000, n), "Zipf (1.3)": np.minimum(rng.zipf(1.3, n), 60000),
                 "period 3": np.tile([1, 2, 3], n // 3 + 1)[:n], "all equal": np.full(n, 7)}
    else:
        cases = {args.tokens: np.fromfile(args.tokens, dtype=np.uint32)}
    for name, tokens in cases.items():
        _measure(name, tokens.astype(np.uint32))


def _measure(name: str, tokens: np.ndarray) -> None:
    tracemalloc.start()
    started = time.perf_counter()
    order = suffix_array(tokens)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{name}: {len(tokens)} tokens, {seconds:.1f} s, peak {peak / len(tokens):.1f} bytes a token "
          f"({peak / 2 ** 20:.0f} MiB); first rows {order[:4].tolist()}")

if __name__ == "__main__":
    main()
