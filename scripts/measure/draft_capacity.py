"""What limits train-draft on the pycode models: the draft's capacity. Pre-trains a fresh draft of a
given size the way the shipped pycode draft was trained (next-token cross-entropy on the pycode
split's training text, batches of 16 x 256 tokens, AdamW, warmup then cosine decay from 3e-3 to
3e-4), then measures it exactly as `specdec train-draft` does (heads.distill.HeldOut: 1 - TV at T = 1
and the greedy match on 16 held-out windows; the chain tau at gamma = 4, greedy and T = 0.8, through
our draft_model on 16 held-out prompts x 128 tokens), every --eval-every steps (tau at the end only).
The model is saved as a Hugging Face checkpoint (usable as draft.path) with capacity.json (shape,
steps, time, curve). --plot draws held-out 1 - TV against steps and training time for saved runs.

    python scripts/measure/draft_capacity.py --hidden 192 --layers 2 --heads 3 --out runs/cap/small
    python scripts/measure/draft_capacity.py --hidden 320 --layers 3 --heads 5 --minutes 40 --out runs/cap/large
    python scripts/measure/draft_capacity.py --plot runs/cap/small runs/cap/large --out capacity.png

The target, draft and split come from configs/train_draft.yaml (paths relative to the repository
root; override them with --set target=... draft=... split_file=...). One torch thread.
Results: benchmarks/results/distill/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from specdec.family.config import LMTrainConfig
from specdec.family.lm import adamw_groups, window_loss
from specdec.heads.distill import DraftShape, HeldOut, load_train_draft_config, new_draft
from specdec.heads.data import fixed_windows, sample_windows
from specdec.heads.loop import lr_at
from specdec.heads.train import training_streams
from specdec.models import load_model, load_tokenizer


def plot(folders: list[str], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for folder in folders:
        with open(os.path.join(folder, "capacity.json")) as f:
            run = json.load(f)
        label = f"{run['parameters'] / 1e6:.1f}M ({run['shape']['hidden']}x{run['shape']['layers']})"
        curve = run["curve"] + ([run["final"]] if run["final"]["step"] != run["curve"][-1]["step"] else [])
        axes[0].plot([p["step"] for p in curve], [p["acceptance_t1"] for p in curve], marker="o", label=label)
        axes[1].plot([p["train_time_s"] / 60 for p in curve], [p["acceptance_t1"] for p in curve], marker="o",
                     label=label)
    axes[0].set_xlabel("training steps (16 x 256 tokens)")
    axes[1].set_xlabel("training minutes (one torch thread)")
    axes[0].set_ylabel("held-out expected acceptance 1 - TV (T = 1)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("fresh pycode drafts pre-trained on text: acceptance by size")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", nargs="+", metavar="RUN", help="plot these saved runs into --out (a .png) and stop")
    parser.add_argument("--hidden", type=int, help="the draft's hidden size")
    parser.add_argument("--layers", type=int, help="the draft's decoder layers")
    parser.add_argument("--heads", type=int, help="the draft's attention heads")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=None, help="stop after this much training time")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of configs/train_draft.yaml (target=..., draft=..., split_file=...)")
    parser.add_argument("--out", required=True, help="the run's folder (or, with --plot, the .png)")
    args = parser.parse_args(argv)
    if args.plot:
        plot(args.plot, args.out)
        return
    if None in (args.hidden, args.layers, args.heads):
        parser.error("--hidden, --layers and --heads are required to train a draft")
    torch.set_num_threads(1)
    cfg = load_train_draft_config("train_draft", [*args.set, f"output_dir={args.out}"])
    target = load_model(cfg.target, "target", torch.device("cpu"), torch.float32, key="target").requires_grad_(False)
    tokenizer = load_tokenizer(cfg.target, "target", key="tokenizer")
    _, _, train_stream, heldout_stream = training_streams(cfg, tokenizer)
    heldout = HeldOut(cfg, target, tokenizer, fixed_windows(heldout_stream, cfg.seq_len, cfg.eval_windows))
    draft = new_draft(target, DraftShape(args.hidden, args.layers, args.heads), seed=1)
    params = sum(p.numel() for p in draft.parameters())
    # the schedule, clipping and optimizer of the family's target pretraining (family/lm.py)
    train_cfg = LMTrainConfig(steps=args.steps, batch_size=args.batch, seq_len=args.seq_len, lr=args.lr,
                              warmup_steps=args.warmup)
    optimizer = torch.optim.AdamW(adamw_groups(draft, train_cfg.weight_decay), lr=args.lr)
    generator = torch.Generator().manual_seed(0)
    curve = [{"step": 0, "train_time_s": 0.0, **heldout.evaluate(draft, tau=False)}]
    print(f"{params / 1e6:.2f}M parameters; step 0: {curve[-1]}", flush=True)
    trained_s, step = 0.0, 0
    draft.train()
    while step < args.steps and (args.minutes is None or trained_s < 60 * args.minutes):
        began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, train_cfg)
        windows = sample_windows(train_stream, args.seq_len + 1, args.batch, generator)   # [b, T + 1]
        loss = window_loss(draft, windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), train_cfg.grad_clip)
        optimizer.step()
        step += 1
        trained_s += time.perf_counter() - began
        if step % args.eval_every == 0 or step == args.steps:
            curve.append({"step": step, "train_time_s": trained_s, "loss": loss.item(),
                          **heldout.evaluate(draft, tau=False)})
            print(f"step {step} ({trained_s / 60:.1f} min) loss {loss.item():.3f} "
                  f"1-TV {curve[-1]['acceptance_t1']:.3f} greedy match {curve[-1]['greedy_match']:.3f}", flush=True)
    final = {"step": step, "train_time_s": trained_s, **heldout.evaluate(draft, tau=True)}
    print(f"final: {final}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    draft.eval().save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    with open(os.path.join(args.out, "capacity.json"), "w") as f:
        json.dump({"shape": vars(args), "parameters": params, "curve": curve, "final": final}, f, indent=1)


if __name__ == "__main__":
    main()
