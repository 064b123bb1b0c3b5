"""auto's variants side by side on held-out source files, in one process: every variant's Speculator is loaded
once, then each round runs every prompt through every variant (the order rotated per prompt and round), the
first round a warm-up; per variant, tokens/s over all timed calls and, per verify step, drafting, verify, other
and prefill milliseconds and the tree nodes (sums of out.stats over the calls, divided by the target forwards).

    python scripts/measure/auto_variants.py --target T --eagle E --split S/split.json --temperature 0 --rounds 3 \\
        --variants '{"default": {}, "eagle": {"auto.more_drafters": []}, "tr": {"auto.drafter": "token_recycling"}}'

Prompts: the first `--prompts` (default 4) held-out files of the split (names relative to this Python's
standard library, as the pycode family's split.json lists them) with at least 700 tokens, tokens 200..584 of
each (384-token prompts); 128 new tokens each. A variant's overrides may name its strategy under "_strategy" (default auto).
"""
from __future__ import annotations

import argparse
import json
import os
import sysconfig

import torch

import specdec
from specdec.types import Stats


def prompts_from(split: str, tokenizer, count: int = 4) -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    prompts = []
    for name in json.load(open(split))["heldout"]:
        path = os.path.join(stdlib, name)
        if not os.path.exists(path):
            continue
        ids = tokenizer(open(path, encoding="utf-8", errors="replace").read())["input_ids"]
        if len(ids) > 700:
            prompts.append(tokenizer.decode(ids[200:584]))
        if len(prompts) == count:
            break
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--split", required=True, help="split.json with a 'heldout' list of stdlib files")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="held-out files to take prompts from")
    parser.add_argument("--variants", default='{"default": {}, "eagle": {"auto.more_drafters": []}, '
                                               '"tr": {"auto.drafter": "token_recycling"}}')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = {"target.path": args.target, "eagle.path": args.eagle}
    variants = json.loads(args.variants)
    loaded = {name: specdec.load(extra.pop("_strategy", "auto"), **base, **extra) for name, extra in variants.items()}
    prompts = prompts_from(args.split, next(iter(loaded.values())).tokenizer, args.prompts)
    stats = {name: [] for name in loaded}
    for round_ in range(args.rounds + 1):
        for i, prompt in enumerate(prompts):
            order = list(loaded.items())
            turn = (round_ + i) % len(order)
            for name, sd in order[turn:] + order[:turn]:
                out = sd.generate(prompt, max_new_tokens=128, temperature=args.temperature, seed=round_,
                                  ignore_eos=True)
                if round_:
                    stats[name].append(out.stats)
    for name, calls in stats.items():
        total = Stats.summed(calls)
        split = total.step_split()
        print(f"{name}: tok/s {total.tokens_per_second:.1f} tau {total.tokens_per_forward:.2f} draft {split.draft_ms:.2f} "
              f"verify {split.verify_ms:.2f} other {split.other_ms:.2f} prefill {split.prefill_ms:.2f} nodes {split.nodes:.1f}")


if __name__ == "__main__":
    main()
