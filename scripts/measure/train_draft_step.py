"""One step of `specdec train-draft`, phase by phase, in seconds: the batch's windows, the batch the
config's data source makes (on-policy: the draft samples its tokens), the target's forward, the
draft's forward, the loss, backward + optimizer; after the loading, the data streams and the
held-out set's set-up, and with --tau the chain tau of the held-out evaluation (greedy and T = 0.8).
benchmarks/results/distill/README.md has what it measured with 1 and 2 torch threads.

    python scripts/measure/train_draft_step.py --threads 1 --tau [key=value ...]   # overrides of configs/train_draft.yaml
"""
from __future__ import annotations

import argparse
import time

import torch

from specdec.heads import distill
from specdec.heads.data import fixed_windows, sample_windows
from specdec.heads.train import training_streams
from specdec.models import DTYPES, load_model, load_tokenizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of configs/train_draft.yaml")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--tau", action="store_true", help="also time the held-out chain tau")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = distill.load_train_draft_config("train_draft", args.overrides)
    cpu = torch.device("cpu")
    print("threads", torch.get_num_threads())
    start = time.perf_counter()
    target = load_model(cfg.target, "target", cpu, DTYPES[cfg.dtype], key="target").requires_grad_(False)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.target, "target", key="tokenizer")
    draft = distill.load_draft(cfg, target, tokenizer, cpu)
    print(f"load {time.perf_counter() - start:.2f} s ({target.dtype}, {draft.dtype})")
    start = time.perf_counter()
    _, _, train_stream, heldout_stream = training_streams(cfg, tokenizer)
    print(f"streams {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    heldout = distill.HeldOut(cfg, target, tokenizer, fixed_windows(heldout_stream, cfg.seq_len, cfg.eval_windows))
    print(f"held-out set-up {time.perf_counter() - start:.2f} s")
    if args.tau:
        draft.eval()
        for temperature in (0.0, 0.8):
            start = time.perf_counter()
            tau = heldout.chain_tau(draft, temperature)
            print(f"chain tau at T = {temperature}: {tau:.2f} ({time.perf_counter() - start:.1f} s)")
    draft.train()
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    weights = distill.loss_spec(cfg)
    for step in range(args.steps):
        times = {}
        start = time.perf_counter()
        windows = sample_windows(train_stream, cfg.seq_len, cfg.batch_size, generator)
        times["windows"] = time.perf_counter() - start
        start = time.perf_counter()
        ids, first = distill.make_batch(cfg, cfg.data, windows, step, 0, target, tokenizer, draft)
        times["batch"] = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            target_logits = target(input_ids=ids).logits[:, first:-1]
        times["target forward"] = time.perf_counter() - start
        start = time.perf_counter()
        draft_logits = draft(input_ids=ids).logits[:, first:-1]
        times["draft forward"] = time.perf_counter() - start
        start = time.perf_counter()
        loss, _ = distill.distill_loss(weights, target_logits.float().flatten(0, 1), draft_logits.float().flatten(0, 1),
                                       ids[:, first + 1:].flatten(), temperature=cfg.loss_temperature)
        times["loss"] = time.perf_counter() - start
        start = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        times["backward + optimizer"] = time.perf_counter() - start
        print(step, {name: round(seconds, 3) for name, seconds in times.items()},
              f"step {sum(times.values()):.2f} s", flush=True)


if __name__ == "__main__":
    main()
