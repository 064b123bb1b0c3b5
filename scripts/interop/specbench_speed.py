"""Spec-Bench's own evaluation/speed.py on our answer files: its figures must be ours.

    python scripts/interop/specbench_speed.py SPEC_BENCH_CHECKOUT BENCH_OUTPUT_DIR [--tokenizer DIR]

SPEC_BENCH_CHECKOUT is a checkout of github.com/hemingkx/Spec-Bench (its code is used as it is there:
nothing of it is copied here). BENCH_OUTPUT_DIR is the output_dir of `specdec bench specbench
questions=...` (its results.json and model_answer/). For every answer file and every task (each
category, then "overall") this calls their speed(answer file, baseline file, tokenizer, task) and
checks, to a relative 1e-9:

* their tokens per second (a mean over questions of new_tokens / wall_time) is ours;
* their mean accepted tokens (a mean over every step's accept_lengths) is ours;
* their speed-up divided by their speed-up of the baseline over itself is ours. Their speed() counts
  the baseline's tokens by tokenizing its answer texts again (len(ids) - 1 per turn: it takes one
  for a BOS), ours counts the tokens generated; that recount is the same in both calls, so the
  quotient is the ratio of the generated counts. Their raw speed-up and the recount (their baseline
  tokens/s over ours) are printed beside it.

The tokenizer is the one the bench ran with (results.json), or --tokenizer. Exit 0 when every figure
agrees, 1 when one does not (each printed), 2 when the input is not there.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

TOLERANCE = 1e-9


class MissingInput(Exception):
    """What the check reads is not there (the message says what to give)."""


def their_speed(checkout: str):
    """Spec-Bench's evaluation.speed.speed, imported from the checkout."""
    if not os.path.isfile(os.path.join(checkout, "evaluation", "speed.py")):
        raise MissingInput(f"{checkout!r} has no evaluation/speed.py: give a checkout of "
                         f"github.com/hemingkx/Spec-Bench")
    sys.path.insert(0, os.path.abspath(checkout))
    from evaluation.speed import speed
    return speed


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=0.0)


def check(checkout: str, output_dir: str, tokenizer: str | None = None) -> tuple[list[str], list[str]]:
    """(report lines, disagreements) for every answer file and task of the bench run in output_dir."""
    path = os.path.join(output_dir, "results.json")
    if not os.path.isfile(path):
        raise MissingInput(f"no {path}: give the output_dir of `specdec bench specbench questions=...`")
    with open(path) as fh:
        part = json.load(fh).get("specbench")
    if not part:
        raise MissingInput(f"{path} is not from a run on a question file (no 'specbench' part): "
                         f"run `specdec bench specbench questions=FILE output_dir={output_dir}`")
    speed = their_speed(checkout)
    tokenizer = tokenizer or part["tokenizer"]
    files = {f["model_id"]: f for f in part["answer_files"]}
    lines = ["| answer file | task | tok/s theirs / ours | mean accepted theirs / ours | speed-up theirs ÷ "
             "baseline self-ratio / ours | raw speed-up theirs | baseline recount |", "|---|---|---|---|---|---|---|"]
    wrong = []
    for ours in part["figures"]:
        entry = files[ours["model_id"]]
        answer = os.path.join(output_dir, entry["file"])
        baseline = os.path.join(output_dir, entry["baseline_file"])
        tps, _, ratio, accepted = speed(answer, baseline, tokenizer, task=ours["task"], report=False)
        base_tps, _, self_ratio, _ = speed(baseline, baseline, tokenizer, task=ours["task"], report=False)
        mean_accepted = sum(accepted) / len(accepted)
        normalised = ratio / self_ratio
        where = f"{ours['model_id']} [{ours['task']}]"
        for name, theirs, mine in (("tokens per second", tps, ours["tokens_per_second"]),
                                   ("mean accepted tokens", mean_accepted, ours["mean_accepted_tokens"]),
                                   ("speed-up over the baseline", normalised, ours["speedup"]),
                                   ("baseline tokens per second", base_tps, ours["baseline_tokens_per_second"])):
            if not _close(float(theirs), float(mine)):
                wrong.append(f"{where}: {name}: Spec-Bench's speed() says {float(theirs)!r}, ours {float(mine)!r}")
        lines.append(f"| {ours['model_id']} | {ours['task']} | {tps:.2f} / {ours['tokens_per_second']:.2f} | "
                     f"{mean_accepted:.4f} / {ours['mean_accepted_tokens']:.4f} | {normalised:.4f} / "
                     f"{ours['speedup']:.4f} | {ratio:.4f} | {1 / self_ratio:.4f} |")
    return lines, wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a checkout of github.com/hemingkx/Spec-Bench")
    parser.add_argument("output_dir", help="output_dir of `specdec bench specbench questions=...`")
    parser.add_argument("--tokenizer", help="the tokenizer folder (default: the one the bench ran with)")
    args = parser.parse_args(argv)
    try:
        lines, wrong = check(args.checkout, args.output_dir, args.tokenizer)
    except MissingInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if wrong:
        print(f"\n{len(wrong)} figure(s) of Spec-Bench's speed() differ from ours:", file=sys.stderr)
        print("\n".join(wrong), file=sys.stderr)
        return 1
    print(f"\nSpec-Bench's speed() gives our figures for {len(lines) - 2} (answer file, task) pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
