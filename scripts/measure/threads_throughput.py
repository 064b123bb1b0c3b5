"""Throughput of one Speculator shared by threads against the same calls made one after another.

    python scripts/measure/threads_throughput.py [config] [key=value ...]
    python scripts/measure/threads_throughput.py prompt_lookup target.path=../shared/models/pycode/target

Runs `--calls` greedy calls (held-out style code prompts from the standard library, `--tokens` new
tokens each) sequentially, then the same calls from `--threads` threads on the same Speculator,
interleaved A/B/A/B for `--rounds` rounds; prints tokens/s of each and their ratio, and checks that
the threaded outputs equal the sequential ones. The verify steps of all calls share one lock, so
on one device the ratio is about 1: what threads buy is correctness, not speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import specdec
from specdec.config import parse_overrides


def prompts(count: int, chars: int = 400) -> list[str]:
    """Windows of standard-library source (deterministic)."""
    root = os.path.dirname(os.__file__)
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and len(out) < count:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            if len(text) > 3 * chars:
                out.append(text[chars: 2 * chars])
    return out


def run_sequential(sd, work, tokens):
    return [sd.generate(p, max_new_tokens=tokens, temperature=0.0, ignore_eos=True).token_ids for p in work]


def run_threaded(sd, work, tokens, threads):
    results = [None] * len(work)

    def worker(t):
        for i in range(t, len(work), threads):
            results[i] = sd.generate(work[i], max_new_tokens=tokens, temperature=0.0, ignore_eos=True).token_ids

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="prompt_lookup")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sd = specdec.load(args.config, **parse_overrides(args.overrides))
    work = prompts(args.calls)
    reference = run_sequential(sd, work[:2], 8)            # warm-up
    seq_times, thr_times = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        reference = run_sequential(sd, work, args.tokens)
        seq_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        threaded = run_threaded(sd, work, args.tokens, args.threads)
        thr_times.append(time.perf_counter() - start)
        if threaded != reference:
            print("MISMATCH: threaded outputs differ from sequential ones", file=sys.stderr)
            return 1
    tokens = sum(len(t) for t in reference)
    seq, thr = statistics.median(seq_times), statistics.median(thr_times)
    print(f"{args.config}: {args.calls} calls x {args.tokens} tokens, {args.threads} threads, "
          f"median of {args.rounds} rounds; outputs identical")
    print(f"  sequential {tokens / seq:.1f} tok/s, threaded {tokens / thr:.1f} tok/s, "
          f"threaded / sequential {seq / thr:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
