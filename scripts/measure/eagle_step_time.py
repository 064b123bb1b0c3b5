"""Seconds of one EAGLE training step (the frozen target's forward, the unrolled drafter, the
backward) in float32 and under bfloat16 autocast, for the shipped train_eagle config:

    python scripts/measure/eagle_step_time.py --threads 1 [key=value ...]   # e.g. layout=eagle3

Random token windows (the cost does not depend on the text). Prints three steps per mode."""
from __future__ import annotations

import argparse
import time

import torch

from specdec.heads.eagle_train import Unrolled, build_drafter, load_train_eagle_config, target_outputs
from specdec.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="train_eagle config overrides")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_train_eagle_config("train_eagle", args.overrides)
    target = load_model(cfg.target, "target", torch.device("cpu"), torch.float32, key="target").requires_grad_(False)
    vocab = target.config.vocab_size
    drafter = build_drafter(cfg, target, torch.randint(0, vocab, (100_000,)))
    unrolled = Unrolled(drafter, cfg.ttt_steps, not drafter.layout.fused)
    batch = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len))
    print(f"threads {torch.get_num_threads()}, layout {cfg.layout}, batch {cfg.batch_size} x {cfg.seq_len}, "
          f"bf16 dot products on this CPU: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    for bf16 in (False, True):
        for _ in range(args.steps):
            began = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                features, last, logits = target_outputs(target, batch, drafter.layout.feature_layers)
                forward_done = time.perf_counter()
                token_loss, feature_loss, _ = unrolled(features, last, logits, batch)
                loss = token_loss.sum() + feature_loss.sum()
            drafter_done = time.perf_counter()
            loss.backward()
            print(f"{'bf16' if bf16 else 'fp32'}: target {forward_done - began:.2f} s, drafter "
                  f"{drafter_done - forward_done:.2f} s, backward {time.perf_counter() - drafter_done:.2f} s")


if __name__ == "__main__":
    main()
