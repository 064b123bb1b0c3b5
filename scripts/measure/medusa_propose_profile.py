"""Where Medusa's drafting goes: cProfile around Medusa.propose alone, over one generate() call of `--new`
tokens on a code-like prompt (after a warm-up call), sorted by cumulative time.

    python scripts/measure/medusa_propose_profile.py --target MODELS/pycode/target --heads HEADS

Why: token-conditioned heads run one head (its token projection, its residual block and the vocabulary
projection) per tree depth, each depth after the last one's tokens are known (benchmarks/results/medusa_pycode)."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import specdec
from specdec.strategies.medusa import Medusa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--heads", required=True)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=30, help="profile rows printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sd = specdec.load("medusa", **{"target.path": args.target, "heads.path": args.heads})
    prompt = "import os\nimport sys\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n" * 8
    sd.generate(prompt, max_new_tokens=32, ignore_eos=True)
    profile = cProfile.Profile()
    propose = Medusa.propose

    def profiled(self, state):
        profile.enable()
        try:
            return propose(self, state)
        finally:
            profile.disable()

    Medusa.propose = profiled
    started = time.perf_counter()
    out = sd.generate(prompt, max_new_tokens=args.new, ignore_eos=True)
    print(f"{out.stats.target_forwards} verify steps, {time.perf_counter() - started:.3f} s")
    pstats.Stats(profile).sort_stats("cumtime").print_stats(args.rows)


if __name__ == "__main__":
    main()
