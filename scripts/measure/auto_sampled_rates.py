"""What `auto` measures of its drafter's calls at a sampling temperature, call after call: on the
prompts a `specdec bench` run used (read from its results.json), one `auto` Speculator generates each in
turn and prints, after each, its planned and measured rates per lookup context (Auto.planned_rates,
Auto.measured_rates) and its look schedule.

    python scripts/measure/auto_sampled_rates.py RESULTS.json --target DIR --eagle DIR [--temperature 0.8]
"""
from __future__ import annotations

import argparse
import json
import os
import sysconfig

import torch
import transformers as T

import specdec


def bench_prompts(results_path: str, tokenizer) -> list[list[int]]:
    """The token ids of the code prompts a bench run used (file, start token, length, from its results.json)."""
    with open(results_path) as f:
        described = json.load(f)["prompts"]["code"]
    root = sysconfig.get_paths()["stdlib"]
    prompts = []
    for item in described:
        with open(os.path.join(root, item["file"])) as f:
            ids = tokenizer(f.read())["input_ids"]
        prompts.append(ids[item["start_token"]: item["start_token"] + item["tokens"]])
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = bench_prompts(args.results, T.AutoTokenizer.from_pretrained(args.target))
    sd = specdec.load("auto", **{"target.path": args.target, "eagle.path": args.eagle})
    auto = sd.strategy
    sd.generate(prompts[0], max_new_tokens=16, temperature=args.temperature, seed=0)     # as the bench's warm-up
    for ids in prompts:
        stats = sd.generate(ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0).stats
        print(f"tau {stats.tokens_per_forward:.2f}  nodes/step {stats.proposed_nodes / stats.target_forwards:.2f}  "
              f"drafter ms/call {1000 * (auto.draft_cost_s or 0):.2f}")
        for context in auto.plan_with:
            planned = [None if x is None else round(x, 1) for x in auto.planned_rates(context)]
            measured = auto.measured_rates(context)
            print(f"  context {context}: planned tok/s with, without {planned}; measured tok/s with, alone "
                  f"{None if measured is None else [round(x, 1) for x in measured[:2]]}")
        print(f"  looks {auto.looks}")


if __name__ == "__main__":
    main()
