"""What the batch A/B scripts of this folder share: their arguments, the `batch` preset's prompts, and
the table of each variant's median rate against autoregressive."""
from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PYCODE = os.path.join(ROOT, "..", "shared", "models", "pycode")


def batch_arguments(doc: str, temperature: float) -> argparse.ArgumentParser:
    """--eagle, --batch (16) and --temperature, described by the script's docstring."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagle", default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=temperature)
    return parser


def preset_prompts(tokenizer) -> tuple[list[list[int]], int]:
    """(the `batch` preset's prompts, its new tokens a prompt): its code and grounded sets."""
    sys.path.insert(0, ROOT)           # benchmarks/ lives at the repository root, not in the package
    from benchmarks.config import load_bench_config
    from benchmarks.prompts import build_prompt_sets
    cfg = load_bench_config("batch")
    sets = build_prompt_sets(cfg.prompts, tokenizer, 2048 - cfg.max_new_tokens)
    return [p.token_ids for group in sets.values() for p in group], cfg.max_new_tokens


def print_rates(rates: dict[str, list[float]], header: str, notes: dict[str, str] | None = None) -> None:
    """Each variant's median tokens/s over its rounds, its ratio to autoregressive's, its rounds."""
    base = statistics.median(rates["autoregressive"])
    print(header)
    for variant, rounds in rates.items():
        median = statistics.median(rounds)
        print(f"{variant:16s} {median:7.1f} tok/s  x autoregressive {median / base:.3f}  "
              f"rounds {[round(rate, 1) for rate in rounds]}")
        if notes and variant in notes:
            print(f"{'':16s} {notes[variant]}")
