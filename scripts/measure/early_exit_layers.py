"""Acceptance of early_exit per exit layer on unseen code: for each exit layer E of the target, a greedy
chain of `--tokens` drafts on held-out prompts; prints a markdown table (drafted tokens accepted, tokens
per target forward) and writes it with a plot. Acceptance does not depend on the machine's load; no time
is measured here (`specdec bench early_exit` times the same rows).

    python scripts/measure/early_exit_layers.py --target DIR --split SPLIT.json --out FOLDER
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def chain_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments of a measure of greedy early_exit chains on held-out code prompts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--target", required=True)
    parser.add_argument("--split", help="JSON with a 'heldout' list of files (the family's split)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=4, help="drafted tokens per step")
    return parser


def target_and_prompts(args) -> tuple:
    """(target in float32 on the CPU, its tokenizer, the held-out code prompts' token ids), one torch thread."""
    from omegaconf import OmegaConf
    from specdec.benchmarks.config import PromptsConfig
    from specdec.benchmarks.prompts import build_prompt_sets
    from specdec.models import load_model, load_tokenizer
    torch.set_num_threads(1)
    target = load_model(args.target, "target", torch.device("cpu"), torch.float32)
    tokenizer = load_tokenizer(args.target)
    cfg = OmegaConf.structured(PromptsConfig(sets=["code"], num=args.prompts, tokens=args.prompt_tokens, split=args.split))
    return target, tokenizer, [p.token_ids for p in build_prompt_sets(cfg, tokenizer, args.prompt_tokens)["code"]]


def main(argv: list[str]) -> int:
    parser = chain_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.strategies.early_exit import EarlyExit, num_layers
    target, tokenizer, prompts = target_and_prompts(args)
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
    from specdec.benchmarks.plots import pyplot
    plt = pyplot()
    fig, left = plt.subplots(figsize=(6, 3.5))
    xs = [r["exit_layer"] for r in rows]
    left.plot(xs, [r["acceptance"] for r in rows], "o-", label="drafted tokens accepted")
    left.set_xlabel("exit layer E")
    left.set_ylabel("acceptance")
    right = left.twinx()
    right.plot(xs, [r["tokens_per_forward"] for r in rows], "s--", color="tab:orange", label="tokens per forward")
    right.set_ylabel("tokens per target forward")
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "layers.png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
