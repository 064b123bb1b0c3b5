"""The target's verify forward of n tree nodes (n + 1 rows, on a 384-token cache) by the real
Verifier, three ways: Hugging Face's own layers (row_linear 0), the RowLinear twin without packed
weights (row_linear 8: weight @ input.T up to 8 rows), and with them (the defaults); medians of 5
rounds, the three interleaved twice. Prints one line per way and round, milliseconds per size.

    python scripts/measure/packed_verify_costs.py MODELS/pycode/target
"""
import sys

import torch
from transformers import AutoModelForCausalLM

from specdec.costmodel import measure_verify_costs
from specdec.row_linear import set_packing

SIZES = [0, 1, 2, 3, 4, 6, 7, 8, 11, 15, 23, 31, 47, 63]
WAYS = [("stock", 0, False), ("row_linear 8", 8, False), ("packed", 8, True)]


def main(path: str) -> None:
    torch.set_num_threads(2)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for _ in range(2):
        for name, row_linear, packed in WAYS:
            set_packing(packed)
            with torch.inference_mode():
                profile = measure_verify_costs(target, SIZES, 384, 5, row_linear=row_linear)
            print(f"{name:>12}  cpu_wait {profile.cpu_wait}  " +
                  " ".join(f"{n}:{s * 1e3:.1f}" for n, s in zip(profile.sizes, profile.seconds)), flush=True)
    set_packing(True)


if __name__ == "__main__":
    main(sys.argv[1])
