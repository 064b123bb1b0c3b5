"""Where an EAGLE step's drafting goes: drafter forwards per verify step, their rows, and one forward's
time warm (called again and again, its weights in the CPU's caches) against its share of a step's
drafting (after a target forward, which evicts them).

One held-out file's window (`--tokens` tokens from token 200 on) completed greedily, `--new` tokens, 2
torch threads (the drafting split into the catch-up on the accepted rows, the tree levels' forwards and the
rest; `--depth` sets eagle.depth); then the drafter alone on a `--past`-row cache, 1, 2 and 4 new rows, medians of 7 x 50
calls.

    python scripts/measure/eagle_step_forwards.py --target T --eagle E --file PATH.py
    python scripts/measure/eagle_step_forwards.py --target T --eagle E --compile

--compile: instead, the drafter's decoder block alone, eager against torch.compile (inductor, freezing,
dynamic shapes), both on unpacked weights (inductor cannot lower oneDNN's packed linear), bfloat16.
"""
from __future__ import annotations

import argparse
import time

import torch

from timing import median_seconds


def median_ms(call) -> float:
    """Milliseconds per call: the median of 7 rounds of 50 calls (warmed up by the caller)."""
    return median_seconds(call, calls=50, rounds=7) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--file", help="a source file the models never saw")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--past", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, help="eagle.depth (the tree's levels at most; default: the config's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.compile:
        return compiled_block(args)

    import specdec
    from specdec.cache import BufferedLayer
    overrides = {"target.path": args.target, "eagle.path": args.eagle}
    if args.depth is not None:
        overrides["eagle.depth"] = args.depth
    sd = specdec.load("eagle", **overrides)
    ids = sd.tokenizer(open(args.file).read())["input_ids"][200: 200 + args.tokens]
    prompt = sd.tokenizer.decode(ids)
    drafter = sd.strategy.drafter
    counts = {"forwards": 0, "rows": 0, "levels": 0, "catch_up_s": 0.0, "catch_up_forward_s": 0.0, "level_forward_s": 0.0}
    forward, catch_up = drafter.forward, sd.strategy.catch_up
    in_catch_up = [False]

    def counted(g, *rest, **kwargs):
        counts["forwards"] += 1
        counts["rows"] += g.shape[1]
        start = time.perf_counter()
        out = forward(g, *rest, **kwargs)
        counts["catch_up_forward_s" if in_catch_up[0] else "level_forward_s"] += time.perf_counter() - start
        counts["levels"] += not in_catch_up[0]
        return out

    def timed_catch_up(token_ids):
        start, in_catch_up[0] = time.perf_counter(), True
        try:
            return catch_up(token_ids)
        finally:
            in_catch_up[0] = False
            counts["catch_up_s"] += time.perf_counter() - start

    drafter.forward, sd.strategy.catch_up = counted, timed_catch_up
    sd.generate(prompt, max_new_tokens=args.new, temperature=0.0, ignore_eos=True)     # warm-up
    splits = []
    for _ in range(5):
        counts.update(forwards=0, rows=0, levels=0, catch_up_s=0.0, catch_up_forward_s=0.0, level_forward_s=0.0)
        stats = sd.generate(prompt, max_new_tokens=args.new, temperature=0.0, ignore_eos=True).stats
        steps = stats.target_forwards
        per_step = stats.step_split()
        splits.append((per_step.draft_ms, per_step.verify_ms, counts["forwards"] / steps,
                       counts["rows"] / counts["forwards"], stats.tokens_per_forward,
                       counts["catch_up_s"] / steps * 1e3, counts["catch_up_forward_s"] / steps * 1e3,
                       counts["level_forward_s"] / steps * 1e3, counts["levels"] / steps))
    drafter.forward = forward
    del sd.strategy.catch_up
    draft_ms, verify_ms, per_step, rows, tau, catch_up_ms, catch_up_forward_ms, levels_ms, levels = sorted(splits)[2]
    print(f"in steps: {per_step:.2f} drafter forwards per step ({rows:.1f} rows each), drafting {draft_ms:.2f} ms "
          f"per step = {draft_ms / per_step:.2f} ms per forward; verify {verify_ms:.2f} ms; tau {tau:.2f} "
          f"(median of 5 calls by drafting time)")
    print(f"  of the drafting per step: the catch-up {catch_up_ms:.2f} ms (its forward {catch_up_forward_ms:.2f} ms), "
          f"the level forwards {levels_ms:.2f} ms ({levels:.2f} per step), the rest (choosing the tree's "
          f"nodes) {draft_ms - catch_up_ms - levels_ms:.2f} ms")

    dtype = next(drafter.parameters()).dtype
    width = drafter.layout.width
    cache = BufferedLayer()
    with torch.inference_mode():
        drafter(torch.randn(1, args.past, width, dtype=dtype), torch.randint(0, 100, (1, args.past)),
                torch.arange(args.past)[None], with_logits=False, cache=cache, start=0)
        for n in (1, 2, 4):
            g = torch.randn(1, n, width, dtype=dtype)
            tokens = torch.randint(0, 100, (1, n))
            positions = torch.full((1, n), args.past)
            visible = torch.ones(1, n, args.past + n, dtype=torch.bool)

            def call():
                return drafter(g, tokens, positions, visible=visible, cache=cache, start=args.past)
            for _ in range(20):
                call()
            print(f"warm: one drafter forward of {n} rows over {args.past} cached rows, with logits "
                  f"({dtype}): {median_ms(call):.3f} ms")


def compiled_block(args) -> None:
    import torch._dynamo
    import torch._inductor.config as inductor
    from transformers import AutoModelForCausalLM
    from specdec.cache import BufferedLayer
    from specdec.heads.eagle_io import bind_eagle, load_eagle
    from specdec.row_linear import set_packing
    set_packing(False)
    inductor.freezing = True
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    drafter = load_eagle(args.eagle, target)
    bind_eagle(drafter, target, torch.bfloat16)
    width, past = drafter.layout.width, args.past
    cache = BufferedLayer()
    blocks = {"eager": drafter.block, "compiled": torch.compile(drafter.block, dynamic=True)}
    with torch.inference_mode():
        drafter(torch.randn(1, past, width, dtype=torch.bfloat16), torch.randint(0, 100, (1, past)),
                torch.arange(past)[None], with_logits=False, cache=cache, start=0)
        for name, block in blocks.items():
            for n in (1, 2, 4):
                x = torch.randn(1, n, width, dtype=torch.bfloat16)
                positions = torch.full((1, n), past)
                visible = torch.ones(1, n, past + n, dtype=torch.bool)
                start = time.perf_counter()
                for _ in range(3):
                    block(x, positions, None, None, visible, cache, past)
                first = time.perf_counter() - start
                ms = median_ms(lambda: block(x, positions, None, None, visible, cache, past))
                print(f"{name:>8} block, {n} rows: {ms:.3f} ms (first 3 calls: {first:.1f} s)", flush=True)
    print("dynamo:", dict(torch._dynamo.utils.counters["stats"]))


if __name__ == "__main__":
    main()
