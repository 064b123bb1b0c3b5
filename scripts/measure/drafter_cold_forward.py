"""One EAGLE drafter forward (a tree level of `--rows` rows over `--past` committed rows, logits included)
timed as a decode loop runs it: right after something else used the core. Medians of `--repeats` forwards,
in microseconds, each after: nothing (hot: the same forward again), a target forward of 8 tokens, a write
of 64 MiB (caches evicted, no Python), 500 small torch ops (the dispatcher busy, few bytes touched), a
5 ms sleep.

    python scripts/measure/drafter_cold_forward.py [--target PATH --eagle PATH]   # default: the embedded family

Why: in a generation the drafter's forwards run between the target's, and what the target's forward
leaves in the caches decides what a drafter forward costs, more than the number of ops it dispatches
(benchmarks/results/eagle_fused)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdec
from specdec.cache import BufferedLayer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="target folder (default: the embedded family's)")
    parser.add_argument("--eagle", default=None, help="EAGLE drafter folder (default: the embedded family's)")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--past", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = {key: value for key, value in (("target.path", args.target), ("eagle.path", args.eagle)) if value}
    sd = specdec.load("eagle", **paths)
    drafter, target = sd.strategy.drafter, sd.target
    dtype = next(drafter.parameters()).dtype
    hidden, vocab = drafter.layout.width, drafter.layout.vocab_size
    cache = BufferedLayer()
    scratch = torch.empty(64 << 20, dtype=torch.uint8)
    small = torch.randn(8, 128)
    target_ids = torch.randint(0, vocab, (1, 8))

    def small_ops():
        x = small
        for _ in range(500):
            x = x + 1

    with torch.inference_mode():
        drafter(torch.randn(1, args.past, hidden, dtype=dtype), torch.randint(0, vocab, (1, args.past)),
                torch.arange(args.past)[None], with_logits=False, cache=cache, start=0)
        g = torch.randn(1, args.rows, hidden, dtype=dtype)
        tokens = torch.randint(0, vocab, (1, args.rows))
        positions = torch.full((1, args.rows), args.past)
        visible = torch.ones(1, args.rows, args.past + args.rows, dtype=torch.bool)
        print(f"drafter {dtype}, hidden {hidden}, vocab {vocab}; {args.rows} rows over {args.past}; "
              f"{torch.get_num_threads()} thread(s); median of {args.repeats}, microseconds")
        for name, before in (("hot", None), ("after a target forward", lambda: target(target_ids)),
                             ("after a 64 MiB write", lambda: scratch.fill_(1)),
                             ("after 500 small ops", small_ops), ("after a 5 ms sleep", lambda: time.sleep(0.005))):
            times = []
            for _ in range(args.repeats):
                if before is not None:
                    before()
                started = time.perf_counter()
                drafter(g, tokens, positions, visible=visible, cache=cache, start=args.past)
                times.append(time.perf_counter() - started)
            print(f"  {name:<24} {1e6 * statistics.median(times):8.0f}")


if __name__ == "__main__":
    main()
