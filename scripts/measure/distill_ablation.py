"""The train-draft ablation: loss (fkl / rkl / jsd / tvd) x data (fixed text / on-policy draft
samples), every run from the config's draft with the same time budget (--minutes of training),
--jobs runs at a time (each on one torch thread, the config's `threads: 1`: on a 2-core CPU --jobs 2
gives every run one core), then the plot and the table (benchmarks/distill_plot.py) into --plot-dir.
benchmarks/results/distill/README.md has what it measured.

    python scripts/measure/distill_ablation.py --minutes 4 --jobs 2 --out runs/distill-ablation
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

LOSSES = ("fkl", "rkl", "jsd", "tvd")
DATA = ("fixed", "draft")


def one_run(loss: str, data: str, args) -> int:
    run = os.path.join(args.out, f"{loss}-{data}")
    print(f"== {loss} / {data} -> {run}", flush=True)
    command = [sys.executable, "-m", "specdec.cli", "train-draft", "train_draft", f"loss={loss}", f"data={data}",
               f"max_minutes={args.minutes}", "eval_interval=10", "checkpoint_interval=1000", "progress=false",
               f"output_dir={run}", *args.overrides]
    return subprocess.run(command).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="more overrides of configs/train_draft.yaml")
    parser.add_argument("--minutes", type=float, default=2.5, help="training minutes of each run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--out", required=True, help="the folder of the runs (one subfolder each)")
    parser.add_argument("--plot-dir", default="benchmarks/results/distill/ablation", help="where the plot and table go")
    args = parser.parse_args(argv)
    runs = [(loss, data) for data in DATA for loss in LOSSES]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        codes = list(pool.map(lambda run: one_run(*run, args), runs))
    failed = [f"{loss}-{data}" for (loss, data), code in zip(runs, codes) if code]
    if failed:
        print(f"failed runs: {failed}", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "specdec.benchmarks.distill_plot", args.out,
                           "--out", args.plot_dir]).returncode or int(bool(failed))


if __name__ == "__main__":
    raise SystemExit(main())
