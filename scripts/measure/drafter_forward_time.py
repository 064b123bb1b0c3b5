"""One EAGLE drafter forward (and its lm_head) as a batch runs it: `--rows` rows, each with `--past`
committed entries in a RaggedRows cache, feeding `--new` rows each; best of 3 x 30, in ms, in float32 and
in bfloat16 (the dtype `eagle.dtype: auto` picks beside a float32 target on a CPU with bf16 dot products).

    python scripts/measure/drafter_forward_time.py --eagle /path/to/eagle [--shapes 1x128x4,16x300x1,...]
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import torch

import specdec
from specdec.heads.eagle import RaggedRows
from specdec.heads.eagle_io import bind_eagle

from batch_common import PYCODE


def forward_ms(drafter, rows: int, past: int, new: int) -> float:
    dtype = next(drafter.parameters()).dtype
    hidden = drafter.layout.width
    cache = RaggedRows()
    with torch.inference_mode():
        g = torch.randn(rows, past, hidden, dtype=dtype)
        tokens = torch.randint(0, drafter.layout.vocab_size, (rows, past))
        positions = torch.arange(past).expand(rows, past)
        cache.prepare(None, torch.zeros(rows, dtype=torch.long), past, rows)
        causal = torch.ones(past, past, dtype=torch.bool).tril()[None].expand(rows, past, past)
        drafter(g, tokens, positions, visible=causal, with_logits=False, cache=cache)

        def step():
            cache.prepare(None, torch.full((rows,), past, dtype=torch.long), past + new, rows)
            out, _, _, _ = drafter(g[:, :new], tokens[:, :new], positions[:, :new] + past,
                                   visible=torch.ones(rows, new, past + new, dtype=torch.bool),
                                   with_logits=False, cache=cache)
            return drafter.logits(out).float()
        for _ in range(10):
            step()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(30):
                step()
            best = min(best, (time.perf_counter() - start) / 30 * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--shapes", default="1x128x4,1x300x1,4x300x1,16x300x1,16x300x4,32x300x1",
                        help="rows x past x new, comma-separated")
    args = parser.parse_args()
    sd = specdec.load("eagle", **{"target.path": os.path.join(PYCODE, "target"), "eagle.path": args.eagle})
    target, drafter = sd.target, sd.strategy.drafter
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    print(f"torch threads {torch.get_num_threads()}; ms per drafter forward + lm_head")
    print(f"{'rows x past x new':>18s} {'float32':>9s} {'bfloat16':>9s}")
    trials = {dtype: bind_eagle(copy.deepcopy(drafter), target, dtype) for dtype in (torch.float32, torch.bfloat16)}
    for rows, past, new in shapes:
        times = [forward_ms(trials[dtype], rows, past, new) for dtype in (torch.float32, torch.bfloat16)]
        print(f"{f'{rows} x {past} x {new}':>18s} {times[0]:9.3f} {times[1]:9.3f}", flush=True)


if __name__ == "__main__":
    main()
