"""One EAGLE tree level (the drafter's forward over `rows` new nodes after `past` committed rows, its
lm_head included) in three kernels: float32 through F.linear, float32 through a RowLinear twin of the
drafter (specdec/row_linear.py), and bfloat16; best of 5 x 20, in ms. Then a torch.profiler table of
the bfloat16 level at 4 rows: where a level's time goes.

    python scripts/measure/eagle_level_kernels.py --target MODELS/pycode/target --eagle PATH/eagle [--past 384]
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from specdec.cache import BufferedLayer
from specdec.heads.eagle_io import bind_eagle, load_eagle
from specdec.row_linear import row_twin


@torch.inference_mode()
def prefilled(model, dtype: torch.dtype, hidden: int, past: int) -> BufferedLayer:
    """A drafter cache holding `past` committed rows."""
    cache = BufferedLayer()
    model(torch.randn(1, past, hidden, dtype=dtype), torch.zeros(1, past, dtype=torch.long),
          torch.arange(past)[None], with_logits=False, cache=cache, start=0)
    return cache


@torch.inference_mode()
def level_ms(model, dtype: torch.dtype, hidden: int, past: int, rows: int) -> float:
    cache = prefilled(model, dtype, hidden, past)
    features = torch.randn(1, rows, hidden, dtype=dtype)                      # [1, rows, H]
    tokens, positions = torch.zeros(1, rows, dtype=torch.long), torch.full((1, rows), past)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            model(features, tokens, positions, cache=cache, start=past)
        best = min(best, (time.perf_counter() - start) / 20)
    return 1e3 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--past", type=int, default=384)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = AutoModelForCausalLM.from_pretrained(args.target).eval()
    drafter = load_eagle(args.eagle, target)
    hidden = drafter.layout.width
    fp32 = bind_eagle(copy.deepcopy(drafter), target, torch.float32)
    arms = {"float32": (fp32, torch.float32), "float32 RowLinear twin": (row_twin(fp32), torch.float32),
            "bfloat16": (bind_eagle(copy.deepcopy(drafter), target, torch.bfloat16), torch.bfloat16)}
    print("rows  " + "  ".join(f"{name:>22s}" for name in arms))
    for rows in (1, 2, 4, 8):
        print(f"{rows:4d}  " + "  ".join(f"{level_ms(model, dtype, hidden, args.past, rows):22.3f}"
                                         for model, dtype in arms.values()), flush=True)
    model, dtype = arms["bfloat16"]
    cache = prefilled(model, dtype, hidden, args.past)
    features, tokens = torch.randn(1, 4, hidden, dtype=dtype), torch.zeros(1, 4, dtype=torch.long)
    positions = torch.full((1, 4), args.past)
    with torch.inference_mode():
        for _ in range(10):
            model(features, tokens, positions, cache=cache, start=args.past)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                model(features, tokens, positions, cache=cache, start=args.past)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
