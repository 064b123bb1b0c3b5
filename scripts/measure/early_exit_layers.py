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


def held_out_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of an acceptance measurement on held-out code: --target, --split, --prompts, --prompt-tokens,
    --new, --tokens (drafted per step), --out; described by the script's docstring."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--split", help="JSON with a 'heldout' list of files (the family's split)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--out", required=True)
    return parser


def held_out_code(target_dir: str, split: str | None, count: int, prompt_tokens: int):
    """(target in fp32 on the CPU, its tokenizer, `count` held-out code prompts of `prompt_tokens` tokens)."""
    from omegaconf import OmegaConf
    from specdec.benchmarks.config import PromptsConfig
    from specdec.benchmarks.prompts import build_prompt_sets
    from specdec.models import load_model, load_tokenizer
    torch.set_num_threads(1)
    target = load_model(target_dir, "target", torch.device("cpu"), torch.float32)
    tokenizer = load_tokenizer(target_dir)
    cfg = OmegaConf.structured(PromptsConfig(sets=["code"], num=count, tokens=prompt_tokens, split=split))
    return target, tokenizer, [p.token_ids for p in build_prompt_sets(cfg, tokenizer, prompt_tokens)["code"]]


def acceptance(sd, prompts: list[list[int]], new: int, after_each=None) -> dict:
    """Greedy generations of `new` tokens from each prompt: drafted tokens accepted, tokens per target forward
    and the counts behind them. after_each(): called after each prompt (what the strategy chose)."""
    new_tokens = forwards = accepted = proposed = 0
    for prompt in prompts:
        stats = sd.generate(prompt, max_new_tokens=new, ignore_eos=True).stats
        new_tokens, forwards = new_tokens + stats.new_tokens, forwards + stats.target_forwards
        accepted, proposed = accepted + sum(stats.accepted_lengths), proposed + stats.proposed_nodes
        if after_each is not None:
            after_each()
    return {"acceptance": accepted / max(proposed, 1), "tokens_per_forward": new_tokens / forwards,
            "new_tokens": new_tokens, "target_forwards": forwards, "accepted": accepted, "proposed": proposed}


def main(argv: list[str]) -> int:
    parser = held_out_arguments(__doc__)
    parser.add_argument("--baseline", help="an earlier run's layers.json to plot beside this one (before / after)")
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.strategies.early_exit import EarlyExit, num_layers
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    rows = []
    for exit_layer in range(1, num_layers(target)):
        sd = Speculator(target, tokenizer, EarlyExit(exit_layer, num_tokens=args.tokens))
        rows.append({"exit_layer": exit_layer, **acceptance(sd, prompts, args.new)})
        print(f"| {exit_layer} | {rows[-1]['acceptance']:.3f} | {rows[-1]['tokens_per_forward']:.3f} |", flush=True)
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
