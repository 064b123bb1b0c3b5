"""Summaries of the raw records: per (row, prompt set, temperature) figures, the markdown table,
the JSON file and the generated section of benchmarks/README.md."""
from __future__ import annotations

import os
import re
from collections import defaultdict

from specdec.atomic import atomic_write_json, atomic_write_text

from .ties import NEAR_TIE, TIE


def _ratio(a, b):
    return a / b if a and b else None


def summarize(records: list[dict], rows, baseline_label: str | None, reference_label: str) -> list[dict]:
    """One entry per (temperature, prompt set, row), rows in config order; ratios are within a (temperature,
    prompt set) group of the same run."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["temperature"], record["prompt_set"], record["row"])].append(record)
    info = {row.label: row for row in rows}
    summary = []
    for (temperature, prompt_set, label), recs in groups.items():
        new_tokens = sum(r["new_tokens"] for r in recs)
        time_s = sum(r["time_s"] for r in recs)
        tally = {k: sum(r["forwards"][k] for r in recs) for k in recs[0]["forwards"]}
        entry = {
            "row": label, "kind": recs[0]["kind"], "temperature": temperature, "prompt_set": prompt_set,
            "generations": len(recs), "new_tokens": new_tokens, "time_s": time_s,
            "tokens_per_s": new_tokens / time_s if time_s else 0.0,
            "sweep": info[label].info.get("sweep"), "sweep_value": info[label].info.get("sweep_value"),
            # time inside the model forwards, seen by hooks, the same way for every row
            "forward_split": {"target": tally["target_time_s"] / time_s, "draft": tally["draft_time_s"] / time_s,
                              "outside": max(0.0, 1 - (tally["target_time_s"] + tally["draft_time_s"]) / time_s)},
            "draft_forwards": tally["draft_calls"],
        }
        stats = [r["stats"] for r in recs if r["stats"] is not None]
        if stats:   # our rows: tau and the loop's own time split
            forwards = sum(s["target_forwards"] for s in stats)
            proposed = sum(s["proposed_nodes"] for s in stats)
            accepted = sum(s["acceptance_rate"] * s["proposed_nodes"] for s in stats)
            total = sum(s["total_time_s"] for s in stats)
            entry["target_forwards"] = forwards
            entry["acceptance_rate"] = accepted / proposed if proposed else None
            part_s = {part: sum(s[f"{part}_time_s"] for s in stats) for part in ("prefill", "draft", "verify", "other")}
            entry["time_split"] = {part: seconds / total for part, seconds in part_s.items()}
            # what one verify step costs, part by part: set against the autoregressive row's verify
            # (a one-token forward) it says what the machinery costs beside the target's own work
            entry["step_ms"] = {part: 1000 * part_s[part] / forwards if forwards else None
                                for part in ("draft", "verify", "other")}
            entry["nodes_per_step"] = proposed / forwards if forwards else None
        else:       # HF rows: every target forward yields tokens (the first one holds the prompt)
            forwards = tally["target_calls"]
            entry["target_forwards"] = forwards
            entry["acceptance_rate"] = None
            entry["time_split"] = None
            entry["step_ms"] = entry["nodes_per_step"] = None
        entry["tokens_per_forward"] = new_tokens / forwards if forwards else None
        checked = [r for r in recs if r["identical"] is not None]
        entry["identity"] = identity_counts([r.get("difference") for r in checked]) if checked else None
        summary.append(entry)
    order = {row.label: i for i, row in enumerate(rows)}
    summary.sort(key=lambda e: (e["temperature"], list(dict.fromkeys(r["prompt_set"] for r in records)).index(
        e["prompt_set"]), order[e["row"]]))
    speed = {(e["temperature"], e["prompt_set"], e["row"]): e["tokens_per_s"] for e in summary}
    for e in summary:
        key = (e["temperature"], e["prompt_set"])
        e["speedup_vs_autoregressive"] = _ratio(e["tokens_per_s"], speed.get(key + (baseline_label,)))
        e["speedup_vs_hf_plain"] = _ratio(e["tokens_per_s"], speed.get(key + (reference_label,)))
    return summary


def identity_counts(differences: list[dict | None]) -> dict:
    """Of compared outputs (None: identical; else benchmarks/ties.classify's dict): how many are
    identical, excused ties and near ties, and mismatches (every difference not excused)."""
    excused = [d for d in differences if d is not None and d["excused"]]
    return {"compared": len(differences), "identical": sum(d is None for d in differences),
            "ties": sum(d["kind"] == TIE for d in excused), "near_ties": sum(d["kind"] == NEAR_TIE for d in excused),
            "mismatches": sum(d is not None and not d["excused"] for d in differences)}


def identity_cell(counts: dict) -> str:
    """"2/2"; "1/2, 1 near tie"; "**0/2 MISMATCH**, 1 tie": identical of compared, then the excused."""
    excused = [f"{n} {name}{'s' if n > 1 else ''}" for n, name in ((counts["ties"], "tie"),
                                                                  (counts["near_ties"], "near tie")) if n]
    cell = f"{counts['identical']}/{counts['compared']}"
    return ", ".join([f"**{cell} MISMATCH**" if counts["mismatches"] else cell] + excused)


def _f(value, fmt: str, dash: str = "—") -> str:
    return dash if value is None else format(value, fmt)


def _pct(split: dict | None, *parts: str) -> str:
    return "—" if not split else " / ".join(f"{100 * split[p]:.0f}" for p in parts)


def _ms(step: dict | None) -> str:
    return "—" if not step or step["verify"] is None else " / ".join(f"{step[p]:.1f}" for p in ("draft", "verify", "other"))


def markdown_tables(summary: list[dict], reference_label: str, baseline_label: str | None) -> str:
    lines = []
    keys = list(dict.fromkeys((e["temperature"], e["prompt_set"]) for e in summary))
    for temperature, prompt_set in keys:
        greedy = temperature == 0
        sampled_identity = not greedy and any(e["identity"] for e in summary
                                              if (e["temperature"], e["prompt_set"]) == (temperature, prompt_set))
        lines += [f"#### `{prompt_set}` prompts, " + ("greedy" if greedy else f"temperature {temperature:g}"), ""]
        head = ["row", "tok/s", f"× {baseline_label or 'AR'}", "× HF plain", "tok/fwd", "accept",
                "prefill / draft / verify / other %", "ms per step: draft / verify / other", "nodes per step",
                "outside fwd %"] + (["same as HF greedy"] if greedy else [])
        head += ["same as coupled AR"] if sampled_identity else []
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for e in summary:
            if (e["temperature"], e["prompt_set"]) != (temperature, prompt_set):
                continue
            name = f"`{e['row']}`" + (" (HF)" if e["kind"] == "hf" else "")
            cells = [name, f"{e['tokens_per_s']:.1f}", _f(e["speedup_vs_autoregressive"], ".2f"),
                     _f(e["speedup_vs_hf_plain"], ".2f"), _f(e["tokens_per_forward"], ".2f"),
                     _f(e["acceptance_rate"], ".2f"), _pct(e["time_split"], "prefill", "draft", "verify", "other"),
                     _ms(e.get("step_ms")), _f(e.get("nodes_per_step"), ".1f"), f"{100 * e['forward_split']['outside']:.0f}"]
            if greedy or sampled_identity:
                ident = e["identity"]
                if greedy and e["row"] == reference_label:
                    cells.append("reference")
                elif ident is None:
                    cells.append("—")
                else:
                    cells.append(identity_cell(ident))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def samples_by_index(records: list[dict], baseline_label: str | None) -> dict:
    """The samples set per sample index: {row: {index: {tokens_per_s, speedup_vs_autoregressive,
    tokens_per_forward}}}, each over that index's requests of every prompt; index "2+" is the second
    sample on (the sampled ones, from the second), "edited" the greedy request with one line edited."""
    samples = [r for r in records if r["prompt_set"] == "samples" and "sample_index" in r]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in samples:
        index = "edited" if record.get("edited") else record["sample_index"]
        groups[(record["row"], index)].append(record)
        if not record.get("edited") and record["sample_index"] >= 1:
            groups[(record["row"], "2+")].append(record)
    out: dict = defaultdict(dict)
    for (row, index), recs in groups.items():
        tokens, time_s = sum(r["new_tokens"] for r in recs), sum(r["time_s"] for r in recs)
        forwards = sum(r["stats"]["target_forwards"] if r["stats"] else r["forwards"]["target_calls"] for r in recs)
        out[row][index] = {"tokens_per_s": tokens / time_s if time_s else 0.0,
                           "tokens_per_forward": tokens / forwards if forwards else None, "requests": len(recs)}
    for row, per_index in out.items():
        for index, entry in per_index.items():
            base = out.get(baseline_label, {}).get(index)
            entry["speedup_vs_autoregressive"] = _ratio(entry["tokens_per_s"], base and base["tokens_per_s"])
    return dict(out)


def samples_table(by_index: dict, baseline_label: str | None, temperature: float) -> str:
    """Markdown: speed-up over our autoregressive row per sample index (tokens per forward under it)."""
    if not by_index:
        return ""
    indices = sorted({i for per in by_index.values() for i in per if isinstance(i, int)})
    columns = indices + ["2+", "edited"]
    names = [f"#{i + 1}" for i in indices] + ["2nd on", "edited, greedy"]
    lines = [f"#### `samples` per sample index: speed-up over `{baseline_label}` (tokens per forward)", "",
             f"Samples #1.. at temperature {temperature:g} (seeds 0, 1, ...), then each prompt again greedy "
             f"with one line edited.", "",
             "| row | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for row, per in by_index.items():
        cells = []
        for index in columns:
            entry = per.get(index)
            cells.append("—" if entry is None else
                         f"{_f(entry['speedup_vs_autoregressive'], '.2f')} ({_f(entry['tokens_per_forward'], '.2f')})")
        lines.append(f"| `{row}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COLUMNS_HELP = """\
Columns: **tok/s** new tokens / wall time, summed over the prompts; **× AR** and **× HF plain** the
ratio of tok/s to our `autoregressive` row and to Hugging Face plain `generate()` in the same run;
**tok/fwd** new tokens per target forward (τ); **accept** accepted drafted tokens / drafted tree
nodes; **prefill / draft / verify / other %** our loop's own split of its time (other = acceptance,
cache commit, stop checks, Python); **ms per step** the same parts in milliseconds per verify step (the
autoregressive row's verify is one plain one-token forward: the yardstick of a step's machinery);
**nodes per step** drafted tree nodes per verify forward; **outside fwd %** the share of wall time outside the target and
draft model forwards, timed by forward hooks the same way for every row; **same** outputs identical
to HF plain greedy, token for token (sampled, coupled sampler: to the coupled autoregressive row's),
then the greedy differences excused in half precision: a **tie** (the target's two logits there both
the top) or a **near tie** (one the top, the other within one unit in the last place of it), found by
one plain target forward at the first differing token; any other difference, and in float32 every
one, is a **MISMATCH**."""


def write_json(path: str, payload: dict) -> None:
    atomic_write_json(path, payload, indent=1, default=str)


def readme_section(name: str, command: str, machine: str, tables: str, plots: list[str], notes: list[str],
                   readme_dir: str, when: str) -> str:
    links = [os.path.relpath(p, readme_dir) for p in plots]
    parts = [f"Generated by `{command}` on {when}.", "", f"Machine: {machine}.", ""]
    parts += [f"* note: {n}" for n in notes] + ([""] if notes else [])
    parts += [tables, "Plots: " + ", ".join(f"[`{os.path.basename(l)}`]({l})" for l in links) + ".", ""]
    parts += [f"![{os.path.basename(l)}]({l})" for l in links]
    return "\n".join(parts)


def rewrite_marked_section(readme_path: str, name: str, body: str) -> None:
    """Replace the text between this preset's markers (appending them when absent)."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = open(readme_path).read() if os.path.exists(readme_path) else ""
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip("\n") + f"\n\n## Results: `{name}` preset\n\n{block}\n"
    atomic_write_text(readme_path, text)
