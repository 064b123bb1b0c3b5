"""The suffix sort of a REST datastore's token ids (strategies/datastore.suffix_array): its wall time and the
peak of what Python and numpy allocate while it runs (tracemalloc), per token, with the ids already in memory.

    python scripts/measure/datastore_sort_memory.py --tokens DATASTORE/tokens.bin

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
    parser.add_argument("--tokens", required=True, help="a datastore's tokens.bin (uint32 ids)")
    args = parser.parse_args()
    tokens = np.fromfile(args.tokens, dtype=np.uint32)
    tracemalloc.start()
    started = time.perf_counter()
    order = suffix_array(tokens)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{len(tokens)} tokens: {seconds:.1f} s, peak {peak / len(tokens):.1f} bytes a token "
          f"({peak / 2 ** 20:.0f} MiB); first rows {order[:4].tolist()}")


if __name__ == "__main__":
    main()
