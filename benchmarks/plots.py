"""PNG plots of a summary: speed-up per row per prompt set, and tokens per target forward against
the sweep value (draft length, tree size) of sweep rows. matplotlib is the `bench` extra, not a
requirement of the library: it is imported when a plot is made (pyplot())."""
from __future__ import annotations

import os
from collections import defaultdict

from specdec.errors import MissingDependencyError


def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend); MissingDependencyError saying what
    to install when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError("the benchmark plots need matplotlib, which is not installed: "
                                     "pip install 'specdec[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _temperature_title(t: float) -> str:
    return "greedy" if t == 0 else f"temperature {t:g}"


def speedup_plot(summary: list[dict], path: str, reference_label: str) -> str:
    """Bars of tok/s over HF plain generate(), one panel per temperature, one group per prompt set."""
    temperatures = list(dict.fromkeys(e["temperature"] for e in summary))
    sets = list(dict.fromkeys(e["prompt_set"] for e in summary))
    rows = list(dict.fromkeys(e["row"] for e in summary))
    kinds = {e["row"]: e["kind"] for e in summary}
    plt = pyplot()
    fig, axes = plt.subplots(len(temperatures), 1, figsize=(min(14, 4 + 0.3 * len(rows) * len(sets)), 3.4 * len(temperatures)),
                             squeeze=False)
    width = 0.8 / len(rows)
    colors = plt.get_cmap("tab20").colors
    for ax, temperature in zip(axes[:, 0], temperatures):
        value = {(e["prompt_set"], e["row"]): e["speedup_vs_hf_plain"] for e in summary if e["temperature"] == temperature}
        for i, row in enumerate(rows):
            xs = [k + (i - (len(rows) - 1) / 2) * width for k in range(len(sets))]
            ys = [value.get((s, row)) or 0.0 for s in sets]
            ax.bar(xs, ys, width, label=row + (" (HF)" if kinds[row] == "hf" else ""), color=colors[i % len(colors)],
                   hatch="//" if kinds[row] == "hf" else None, edgecolor="black", linewidth=0.4)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(sets)), sets)
        ax.set_ylabel(f"speed-up over {reference_label}")
        ax.set_title(_temperature_title(temperature))
    axes[0, 0].legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def sweep_plot(summary: list[dict], path: str) -> str | None:
    """Tokens per target forward against the sweep value, a line per (sweep, prompt set, temperature)."""
    lines = defaultdict(list)
    for e in summary:
        if e["sweep"] and e["sweep_value"] is not None and e["tokens_per_forward"] is not None:
            lines[(e["sweep"], e["prompt_set"], e["temperature"])].append((e["sweep_value"], e["tokens_per_forward"]))
    if not lines:
        return None
    sweeps = list(dict.fromkeys(k[0] for k in lines))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 3.8), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps):
        for (name, prompt_set, temperature), points in lines.items():
            if name != sweep:
                continue
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linestyle="-" if temperature == 0 else "--",
                    label=f"{prompt_set}, {_temperature_title(temperature)}")
        ax.set_xlabel(sweep)
        ax.set_ylabel("tokens per target forward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(summary: list[dict], output_dir: str, reference_label: str, by_index: dict | None = None,
                baseline_label: str | None = None) -> list[str]:
    made = [speedup_plot(summary, os.path.join(output_dir, "speedup.png"), reference_label)]
    sweep = sweep_plot(summary, os.path.join(output_dir, "tokens_per_forward_sweep.png"))
    samples = samples_plot(by_index or {}, os.path.join(output_dir, "samples_speedup.png"), baseline_label)
    return made + [p for p in (sweep, samples) if p]


def samples_plot(by_index: dict, path: str, baseline_label: str | None) -> str | None:
    """Speed-up over our autoregressive row against the sample index of the samples set (the last
    point: the edited prompt, greedy), a line per row: how reuse across requests grows."""
    if not by_index:
        return None
    indices = sorted({i for per in by_index.values() for i in per if isinstance(i, int)})
    xs = list(range(len(indices) + 1))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for k, (row, per) in enumerate(by_index.items()):
        ys = [(per.get(i) or {}).get("speedup_vs_autoregressive") for i in indices + ["edited"]]
        ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], marker="o",
                label=row, color=f"C{k % 10}", linestyle="--" if row.startswith("HF") else "-")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(xs, [f"#{i + 1}" for i in indices] + ["edited\n(greedy)"])
    ax.set_xlabel("sample of the same prompt (arrival order)")
    ax.set_ylabel(f"speed-up over {baseline_label or 'autoregressive'}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
