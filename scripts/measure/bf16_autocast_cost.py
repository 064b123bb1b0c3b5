"""bf16 autocast against float32 for one train-draft batch: the target's forward plus the draft's
forward and backward of a batch of --batch x --seq-len random token ids, interleaved --repeats
times, seconds each. On a CPU without native bf16 matrix products (AVX2) autocast is several times
slower, which is why configs/train_draft.yaml keeps `bf16: false` (benchmarks/results/distill/README.md).

    python scripts/measure/bf16_autocast_cost.py --target MODELS/pycode/target --draft MODELS/pycode/draft
"""
from __future__ import annotations

import argparse
import time

import torch

from specdec.models import load_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the target's folder (a Hugging Face checkpoint)")
    parser.add_argument("--draft", required=True, help="the draft's folder")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    target = load_model(args.target, "target", cpu, torch.float32, key="target")
    draft = load_model(args.draft, "draft", cpu, torch.float32, key="draft")
    ids = torch.randint(1, target.config.vocab_size, (args.batch, args.seq_len))
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for bf16 in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                start = time.perf_counter()
                with torch.no_grad():
                    target(input_ids=ids)
                draft(input_ids=ids).logits.float().sum().backward()
                seconds[bf16].append(time.perf_counter() - start)
    for bf16, values in seconds.items():
        print("bf16 autocast" if bf16 else "float32      ", [round(v, 2) for v in values])


if __name__ == "__main__":
    main()
