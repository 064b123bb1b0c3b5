"""Held-out next-token loss of default-family targets, all on the same windows, to compare families
built by different checkouts (each family's own train.json measures 8 windows of its own choosing):
every held-out file of the family's split (tokenizer/split.json), 256 evenly spaced windows of 129
tokens (128 predictions each), one torch thread. Prints one JSON line per family folder, with its
target's train.json (if any) beside.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/measure/family_target_loss.py CACHE/default-<hash> ...

A folder needs tokenizer/ and target/ only (a family whose later parts are not built yet will do)."""
from __future__ import annotations

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.family.lm import window_loss
from specdec.heads.data import fixed_windows, tokenize_files

WINDOWS, WINDOW_TOKENS, BATCH = 256, 129, 16


@torch.no_grad()
def heldout_loss(folder: str) -> dict:
    with open(os.path.join(folder, "tokenizer", "split.json")) as f:
        split = json.load(f)
    target = os.path.join(folder, "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    stream = tokenize_files([os.path.join(split["root"], name) for name in split["heldout"]], tokenizer,
                            tokenizer.eos_token_id)                                   # [T]
    windows = fixed_windows(stream, WINDOW_TOKENS, WINDOWS)                           # [n, 129]
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    losses = [float(window_loss(model, windows[i: i + BATCH])) for i in range(0, len(windows), BATCH)]
    record = None                                   # a target made outside the builder has no train.json
    if os.path.isfile(os.path.join(target, "train.json")):
        with open(os.path.join(target, "train.json")) as f:
            record = json.load(f)
    return {"folder": folder, "heldout_tokens": int(stream.numel()), "windows": len(windows),
            "heldout_loss": sum(losses) / len(losses), "train_json": record}


def main() -> None:
    torch.set_num_threads(1)
    for folder in sys.argv[1:]:
        print(json.dumps(heldout_loss(folder)), flush=True)


if __name__ == "__main__":
    main()
