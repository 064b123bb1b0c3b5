"""Batch benchmarks (a preset with `batch_sizes`, e.g. `specdec bench batch`): total tokens/s over a
list of prompts at each batch size, for every row: our strategies through generate(list,
batch_size=B) and Hugging Face's own batched generate() (left padding, plain decoding). Rows run
one after another at each (temperature, batch size), their order rotating, after an untimed
warm-up, `repeats` rounds of them (each row's median rate kept); at temperature 0 every row's outputs
are checked against our batched autoregressive's, prompt by prompt, each difference classified as a
tie, a near tie or a mismatch (benchmarks/ties.py)."""
from __future__ import annotations

import os
import statistics
import time

import torch

from .generation import shared_generation_config
from .peers import HFRow
from .plots import pyplot
from .report import identity_cell, identity_counts
from .ties import classify


@torch.inference_mode()
def hf_batch_generate(row: HFRow, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int,
                      batch_size: int) -> list[list[int]]:
    """HF plain generate() over `prompts`, batch_size at a time, left-padded (what HF's docs say to
    do for decoder-only batches); the new tokens of each prompt."""
    target = row.target
    config = row._generation_config(max_new_tokens, temperature)
    pad = config.pad_token_id
    outputs = []
    torch.manual_seed(seed)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        width = max(len(p) for p in chunk)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=target.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=target.device)
        out = target.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
        outputs += [row_ids[width:].tolist() for row_ids in out]
    return outputs


def our_batch_generate(row, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int,
                       batch_size: int) -> list[list[int]]:
    target = row.speculator.target
    saved = target.generation_config          # the generation_config HF's rows use, for this call only
    target.generation_config = shared_generation_config(target)
    try:
        outs = row.speculator.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=0,
                                       top_p=1.0, seed=[seed + i for i in range(len(prompts))], ignore_eos=True,
                                       batch_size=batch_size)
    finally:
        target.generation_config = saved
    return [out.token_ids for out in outs]


def batch_rows(rows) -> list:
    """The rows that can run a batch: ours, and HF's plain generate() (assisted and prompt-lookup
    generate() refuse batches)."""
    return [r for r in rows if r.kind == "specdec" or (isinstance(r, HFRow) and r.entry.kind == "plain")]


def run_batches(rows, prompts: list[list[int]], cfg, console) -> list[dict]:
    records = []
    baseline = next((r.label for r in rows if r.kind == "specdec" and r.info.get("strategy") == "autoregressive"),
                    None)
    step = 0
    for temperature in cfg.temperatures:
        for batch_size in cfg.batch_sizes:
            outputs, rates = {}, {row.label: [] for row in rows}
            # `repeats` rounds over the rows, each round in a rotated order: a load swing on a shared
            # machine then hits every row alike, and each row's rate is the median of its rounds
            for _ in range(cfg.repeats):
                shift = step % len(rows)
                step += 1
                for row in rows[shift:] + rows[:shift]:
                    generate = our_batch_generate if row.kind == "specdec" else hf_batch_generate
                    if cfg.warmup_tokens > 0:
                        generate(row, prompts[:batch_size], min(cfg.warmup_tokens, cfg.max_new_tokens), temperature,
                                 cfg.seeds[0], batch_size)
                    start = time.perf_counter()
                    tokens = generate(row, prompts, cfg.max_new_tokens, temperature, cfg.seeds[0], batch_size)
                    elapsed = time.perf_counter() - start
                    outputs[row.label] = tokens
                    rates[row.label].append(sum(len(t) for t in tokens) / elapsed)
                    console.print(f"T={temperature:g} batch {batch_size:>3} {row.label:<32} "
                                  f"{rates[row.label][-1]:8.1f} tok/s")
            for row in rows:
                new = sum(len(t) for t in outputs[row.label])
                rate = statistics.median(rates[row.label])
                records.append({"row": row.label, "kind": row.kind, "temperature": temperature,
                                "batch_size": batch_size, "prompts": len(prompts), "new_tokens": new,
                                "time_s": new / rate, "tokens_per_second": rate,
                                "rounds_tokens_per_second": rates[row.label], "identical": None})
            if temperature == 0 and baseline is not None:
                target = next(row for row in rows if row.label == baseline).speculator.target
                config = shared_generation_config(target)
                for record in records[-len(rows):]:
                    differences = [classify(target, prompt, tokens, reference, config) for prompt, tokens, reference
                                   in zip(prompts, outputs[record["row"]], outputs[baseline])]
                    record["identical"] = all(d is None for d in differences)
                    record["identity"] = identity_counts(differences)
                    record["differences"] = [{"prompt": i, **d} for i, d in enumerate(differences) if d is not None]
    return records


def batch_table(records: list[dict], reference: str, baseline: str | None) -> str:
    """Markdown: tokens/s per row and batch size, with × HF batched plain and × our batched AR."""
    lines = []
    for temperature in sorted({r["temperature"] for r in records}):
        lines += [f"### temperature {temperature:g}", "",
                  "| row | batch | tokens/s | × HF batched | × AR batched | same as AR |", "|---|---:|---:|---:|---:|---|"]
        at_t = [r for r in records if r["temperature"] == temperature]
        for size in sorted({r["batch_size"] for r in at_t}):
            group = {r["row"]: r for r in at_t if r["batch_size"] == size}
            ref, base = group.get(reference), group.get(baseline)
            for label, r in group.items():
                x_hf = r["tokens_per_second"] / ref["tokens_per_second"] if ref else float("nan")
                x_ar = r["tokens_per_second"] / base["tokens_per_second"] if base else float("nan")
                same = "" if r["identical"] is None else ("yes" if r["identical"] else identity_cell(r["identity"]))
                lines.append(f"| {label} | {size} | {r['tokens_per_second']:.1f} | {x_hf:.2f} | {x_ar:.2f} | {same} |")
        lines.append("")
    return "\n".join(lines)


def batch_plot(records: list[dict], output_dir: str) -> list[str]:
    """tokens/s against batch size, one line per row, one panel per temperature."""
    plt = pyplot()
    temperatures = sorted({r["temperature"] for r in records})
    fig, axes = plt.subplots(1, len(temperatures), figsize=(6 * len(temperatures), 4.5), squeeze=False)
    labels = sorted(dict.fromkeys(r["row"] for r in records))
    colors = {label: f"C{i}" for i, label in enumerate(labels)}          # one color per row in every panel
    for ax, temperature in zip(axes[0], temperatures):
        at_t = [r for r in records if r["temperature"] == temperature]
        for label in labels:
            points = sorted((r["batch_size"], r["tokens_per_second"]) for r in at_t if r["row"] == label)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label, color=colors[label])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("total tokens/s")
        ax.set_title(f"temperature {temperature:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(output_dir, "batch_tokens_per_second.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
