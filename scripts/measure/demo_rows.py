"""`make demo`'s prompt and default family, with rows the demo does not show: each row generates 128 tokens
greedy (checked identical to Hugging Face's greedy first), then `--rounds` rounds run every row in turn
(interleaved, one Speculator per row kept across rounds: what auto learns stays), and each row's median
prints as tokens/s and as a multiple of the first row. The family is the demo's (built first if missing).

    python scripts/measure/demo_rows.py --threads 1 --rounds 5 --rows "autoregressive,auto(eagle),auto(eagle+tr)"
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdec
from specdec.family.demo import DEFAULT_PROMPT, choose_models, hf_greedy


def rows_of(models) -> dict:
    """Row name -> (strategy config, overrides)."""
    return {
        "autoregressive": ("autoregressive", {}),
        "prompt_lookup": ("prompt_lookup", {}),
        "token_recycling": ("token_recycling", {}),
        "eagle": ("eagle", {"eagle.path": models.eagle}),
        "auto(eagle)": ("auto", {"eagle.path": models.eagle}),
        "auto(eagle+tr)": ("auto", {"eagle.path": models.eagle, "auto.more_drafters": ["token_recycling"]}),
        "auto(tr)": ("auto", {"auto.drafter": "token_recycling"}),
        "auto(none)": ("auto", {"auto.drafter": "none"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="autoregressive,auto(eagle),auto(eagle+tr),auto(tr)")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = choose_models(None, None, None, None, None, [], None)
    known = rows_of(models)
    names = args.rows.split(",")
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(known)}")
    speculators = {name: specdec.load(known[name][0], **{"target.path": models.target, "device": "cpu",
                                                           **known[name][1]}) for name in names}
    first = speculators[names[0]]
    ids = first.tokenizer(DEFAULT_PROMPT)["input_ids"]
    reference = hf_greedy(first.target, ids, args.new_tokens)

    def run(sd):
        return sd.generate(DEFAULT_PROMPT, max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)

    for name, sd in speculators.items():            # a warm-up call each, and the identity check
        assert run(sd).token_ids == reference, f"{name} is not Hugging Face's greedy text"
    times, stats = {name: [] for name in [*names, "HF generate()"]}, {}
    for _ in range(args.rounds):
        for name, sd in speculators.items():
            started = time.perf_counter()
            stats[name] = run(sd).stats
            times[name].append(time.perf_counter() - started)
        started = time.perf_counter()
        hf_greedy(first.target, ids, args.new_tokens)
        times["HF generate()"].append(time.perf_counter() - started)
    base = statistics.median(times[names[0]])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        tau = f"{stats[name].new_tokens / stats[name].target_forwards:.2f}" if name in stats else "-"
        print(f"{name:16s} {args.new_tokens / median:7.1f} tok/s  x {names[0]} {base / median:5.2f}  tok/fwd {tau}")


if __name__ == "__main__":
    main()
