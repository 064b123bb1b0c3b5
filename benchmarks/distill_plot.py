"""Plot and tabulate a train-draft ablation: one folder per run (`<loss>-<data>`, each holding the
train_draft.json its run wrote), held-out acceptance against training time per loss.

    python -m specdec.benchmarks.distill_plot RUNS_FOLDER --out benchmarks/results/distill/ablation [--name ablation]
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from .plots import pyplot

DATA_NAMES = {"fixed": "fixed text", "draft": "on-policy (draft samples)", "target": "target samples",
              "mixed": "mixed"}
METRICS = (("acceptance_t1", "held-out 1 - TV (T = 1)"), ("tau_greedy", "chain tau, gamma 4, greedy"),
           ("tau_t0.8", "chain tau, gamma 4, T = 0.8"))


def read_runs(folder: str) -> dict[tuple[str, str], dict]:
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*", "train_draft.json"))):
        with open(path) as f:
            log = json.load(f)
        cfg = log["config"]
        loss = cfg["loss"] if isinstance(cfg["loss"], str) else "+".join(f"{w:g} {k}" for k, w in cfg["loss"].items())
        runs[(loss, cfg["data"])] = log
    return runs


def plot(runs: dict, out: str, name: str = "ablation") -> str:
    plt = pyplot()
    datas = sorted({data for _, data in runs}, key=list(DATA_NAMES).index)
    fig, axes = plt.subplots(len(METRICS), len(datas), figsize=(5 * len(datas), 3.2 * len(METRICS)), squeeze=False,
                             sharey="row")
    for col, data in enumerate(datas):
        for row, (key, label) in enumerate(METRICS):
            ax = axes[row][col]
            for (loss, run_data), log in sorted(runs.items()):
                if run_data != data:
                    continue
                points = [(h["train_time_s"] / 60, h[key]) for h in log["history"] if key in h]
                ax.plot(*zip(*points), marker="o", markersize=3, label=loss)
            ax.set_title(f"{DATA_NAMES.get(data, data)}", fontsize=10)
            ax.set_xlabel("training time (min)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    return path


def table(runs: dict) -> str:
    lines = ["| loss | data | steps | train min | 1-TV (T=1) | greedy match | τ greedy | τ T=0.8 |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    first = next(iter(runs.values()))["history"][0]
    lines.append(f"| (start: the shipped draft) | | 0 | 0 | {first['acceptance_t1']:.3f} | {first['greedy_match']:.3f} | "
                 f"{first.get('tau_greedy', float('nan')):.2f} | {first.get('tau_t0.8', float('nan')):.2f} |")
    for (loss, data), log in sorted(runs.items(), key=lambda kv: (list(DATA_NAMES).index(kv[0][1]), kv[0][0])):
        last = log["history"][-1]
        lines.append(f"| {loss} | {DATA_NAMES.get(data, data)} | {last['step']} | {last['train_time_s'] / 60:.1f} | "
                     f"{last['acceptance_t1']:.3f} | {last['greedy_match']:.3f} | "
                     f"{last.get('tau_greedy', float('nan')):.2f} | {last.get('tau_t0.8', float('nan')):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="folder with one sub-folder per run")
    parser.add_argument("--out", default="benchmarks/results/distill/ablation")
    parser.add_argument("--name", default="ablation", help="the files written: NAME.png and NAME_table.md")
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    if not runs:
        raise SystemExit(f"no runs (*/train_draft.json) under {args.runs}")
    os.makedirs(args.out, exist_ok=True)
    print(f"plot: {plot(runs, args.out, args.name)}")
    text = table(runs)
    with open(os.path.join(args.out, f"{args.name}_table.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
