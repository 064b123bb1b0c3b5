"""Acceptance of early_exit per exit layer on unseen code: for each exit layer E of the target, a greedy
chain of `--tokens` drafts on held-out prompts; prints a markdown table (drafted tokens accepted, tokens
per target forward) and writes it with a plot. Acceptance does not depend on the machine's load; no time
is measured here (`specdec bench early_exit` times the same rows).

    python scripts/measure/early_exit_layers.py --target DIR --split SPLIT.json --out FOLDER
    python scripts/measure/early_exit_layers.py --target TUNED --split ... --out FOLDER --baseline BEFORE/layers.json

--baseline: an earlier run's layers.json (the same target before `specdec train early-exit`) drawn beside
this one's rows in the plot, labelled before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--split", help="JSON with a 'heldout' list of files (the family's split)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--out", required=True)
    parser.add_argument("--baseline", help="an earlier run's layers.json to plot beside this one (before / after)")
    args = parser.parse_args(argv)
    from omegaconf import OmegaConf
    from specdec.benchmarks.config import PromptsConfig
    from specdec.benchmarks.prompts import build_prompt_sets
    from specdec import Speculator
    from specdec.models import load_model, load_tokenizer
    from specdec.strategies.early_exit import EarlyExit, num_layers
    torch.set_num_threads(1)
    target = load_model(args.target, "target", torch.device("cpu"), torch.float32)
    tokenizer = load_tokenizer(args.target)
    cfg = OmegaConf.structured(PromptsConfig(sets=["code"], num=args.prompts, tokens=args.prompt_tokens, split=args.split))
    prompts = [p.token_ids for p in build_prompt_sets(cfg, tokenizer, args.prompt_tokens)["code"]]
    rows = []
    for exit_layer in range(1, num_layers(target)):
        sd = Speculator(target, tokenizer, EarlyExit(exit_layer, num_tokens=args.tokens))
        new = forwards = accepted = proposed = 0
        for prompt in prompts:
            stats = sd.generate(prompt, max_new_tokens=args.new, ignore_eos=True).stats
            new, forwards = new + stats.new_tokens, forwards + stats.target_forwards
            accepted, proposed = accepted + sum(stats.accepted_lengths), proposed + stats.proposed_nodes
        rows.append({"exit_layer": exit_layer, "acceptance": accepted / proposed, "tokens_per_forward": new / forwards,
                     "new_tokens": new, "target_forwards": forwards, "accepted": accepted, "proposed": proposed})
        print(f"| {exit_layer} | {accepted / proposed:.3f} | {new / forwards:.3f} |", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "layers.json"), "w") as fh:
        json.dump({"args": vars(args), "rows": rows}, fh, indent=1)
    runs = [("this run", rows)]
    if args.baseline:
        with open(args.baseline) as fh:
            runs = [("before", json.load(fh)["rows"]), ("after", rows)]
    from specdec.benchmarks.plots import pyplot
    plt = pyplot()
    fig, left = plt.subplots(figsize=(6, 3.5))
    right = left.twinx()
    for (label, shown), color in zip(runs, ("tab:blue", "tab:orange")):
        xs = [r["exit_layer"] for r in shown]
        left.plot(xs, [r["acceptance"] for r in shown], "o-", color=color, label=f"drafted tokens accepted ({label})")
        right.plot(xs, [r["tokens_per_forward"] for r in shown], "s--", color=color, alpha=0.6,
                   label=f"tokens per forward ({label})")
    left.set_xlabel("exit layer E")
    left.set_ylabel("acceptance (solid)")
    right.set_ylabel("tokens per target forward (dashed)")
    fig.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "layers.png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
