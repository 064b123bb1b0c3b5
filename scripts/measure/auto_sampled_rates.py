"""What `auto` measures of its drafter's calls at a sampling temperature, call after call: on the
prompts a `specdec bench` run used (read from its results.json), one `auto` Speculator generates each in
turn and prints, after each, its planned and measured rates per lookup context (Auto.planned_rates,
Auto.measured_rates) and its look schedule, with what the drafter's calls kept: calls, tokens kept per call
(split into steady calls and catch-ups, the first call after a gap), tokens lookup alone would have kept on
those steps, and nodes verified per call.

    python scripts/measure/auto_sampled_rates.py RESULTS.json --target DIR --eagle DIR [--temperature 0.8] \
        [--draft-ms MS] [--margin M]

--draft-ms: plan with this drafter cost per call and the stored verify profile as it is (not re-measured nor
scaled by the step times): on a loaded machine the measured times are noise that moves every decision, while
what a call keeps is not. --margin: auto's MEASURED_MARGIN for this run (0: judge calls by their mean alone).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sysconfig

import torch
import transformers as T

import specdec
from specdec.strategies import auto as auto_module


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


def traced_calls(auto_class) -> list[tuple]:
    """Wrap auto_class._record_call to keep, per drafter call, (tokens the step kept, nodes verified, tokens
    lookup alone would have kept, whether the call was steady rather than a catch-up after a gap)."""
    calls: list[tuple] = []
    record = auto_class._record_call

    def traced(self, state, result, verified, lookup_alone, context):
        record(self, state, result, verified, lookup_alone, context)
        tokens, nodes, alone, _ = self.call_values[context][-1]
        calls.append((tokens, nodes, alone, self.steady_call))
    auto_class._record_call = traced
    return calls


def describe_calls(calls: list[tuple]) -> str:
    if not calls:
        return "no drafter calls"

    def mean(values):
        return f"{statistics.fmean(values):.2f}" if values else "-"
    steady = [tokens for tokens, _, _, is_steady in calls if is_steady]
    catch_up = [tokens for tokens, _, _, is_steady in calls if not is_steady]
    return (f"calls {len(calls)}: kept/call {mean([c[0] for c in calls])} (steady {len(steady)}: {mean(steady)}, "
            f"catch-up {len(catch_up)}: {mean(catch_up)}), lookup alone/call {mean([c[2] for c in calls])}, "
            f"nodes/call {mean([c[1] for c in calls])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-ms", type=float, help="plan with this drafter cost per call, costs not adapted")
    parser.add_argument("--margin", type=float, help="auto's MEASURED_MARGIN for this run")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.margin is not None:
        auto_module.MEASURED_MARGIN = args.margin
    calls = traced_calls(auto_module.Auto)
    prompts = bench_prompts(args.results, T.AutoTokenizer.from_pretrained(args.target))
    sd = specdec.load("auto", **{"target.path": args.target, "eagle.path": args.eagle})
    auto = sd.strategy
    if args.draft_ms is not None:
        auto.adapt_costs, auto.draft_cost_s, auto.cost_known = False, args.draft_ms / 1000, True
    sd.generate(prompts[0], max_new_tokens=16, temperature=args.temperature, seed=0)     # as the bench's warm-up
    for ids in prompts:
        calls.clear()
        stats = sd.generate(ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0).stats
        print(f"tau {stats.tokens_per_forward:.2f}  steps {stats.target_forwards}  "
              f"nodes/step {stats.proposed_nodes / stats.target_forwards:.2f}  "
              f"drafter ms/call {1000 * (auto.draft_cost_s or 0):.2f}")
        print("  " + describe_calls(calls))
        for context in auto.plan_with:
            planned = [None if x is None else round(x, 1) for x in auto.planned_rates(context)]
            measured = auto.measured_rates(context)
            print(f"  context {context}: planned tok/s with, without {planned}; measured tok/s with, alone "
                  f"{None if measured is None else [round(x, 1) for x in measured[:2]]}")
        print(f"  looks {auto.looks}")


if __name__ == "__main__":
    main()
