"""Greedy chain tau (gamma 4, --new-tokens new tokens) of several drafts on held-out windows other than
train-draft's own evaluation: --windows windows of 512 tokens from the held-out split, each cut to a
prompt of each --prompt-lengths length (the last 128 tokens of a window are never in a prompt).
Prints each draft's tau over all prompts and per prompt. The target and split come from
configs/train_draft.yaml (--set overrides it).

    python scripts/measure/draft_tau.py shipped=MODELS/pycode/draft distilled=runs/distill-pycode
"""
from __future__ import annotations

import argparse
import time

import torch

from specdec.api import Speculator
from specdec.heads import distill
from specdec.heads.data import fixed_windows
from specdec.heads.train import training_streams
from specdec.models import load_model, load_tokenizer
from specdec.strategies.draft_model import DraftModel


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafts", nargs="+", metavar="NAME=PATH", help="the drafts to measure")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[64, 384])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of configs/train_draft.yaml (target=..., split_file=...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = distill.load_train_draft_config("train_draft", args.set)
    cpu = torch.device("cpu")
    target = load_model(cfg.target, "target", cpu, torch.float32, key="target")
    tokenizer = load_tokenizer(cfg.target, "target", key="tokenizer")
    drafts = {name: load_model(path, "draft", cpu, torch.float32, key="draft")
              for name, _, path in (d.partition("=") for d in args.drafts)}
    _, _, _, heldout = training_streams(cfg, tokenizer, False)
    windows = fixed_windows(heldout, 512, args.windows)                 # [windows, 512]
    for length in args.prompt_lengths:
        prompts = [row[-128 - length:-128].tolist() for row in windows]
        for name, draft in drafts.items():
            start = time.perf_counter()
            outs = Speculator(target, tokenizer, DraftModel(draft, num_tokens=4)).generate(
                prompts, max_new_tokens=args.new_tokens, ignore_eos=True)
            tau = sum(o.stats.new_tokens for o in outs) / sum(o.stats.target_forwards for o in outs)
            per_prompt = [round(o.stats.new_tokens / o.stats.target_forwards, 2) for o in outs]
            print(f"prompt {length} {name}: tau greedy {tau:.3f} per prompt {per_prompt} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
