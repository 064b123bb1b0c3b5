"""The timed runs: interleaved per prompt (every row on prompt 1, then prompt 2, ...; the row
order rotates from prompt to prompt) so machine drift hits all rows alike; one untimed warm-up
per row and temperature; an output-identity check against HF plain greedy at temperature 0, each
difference classified as a tie, a near tie or a mismatch (benchmarks/ties.py)."""
from __future__ import annotations

import time

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.check import first_divergence

from .generation import Generation, shared_generation_config
from .meter import ForwardMeter
from .ties import classify, describe, unclassified


def _progress(enabled: bool, console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not enabled,
                    transient=False)


def run_all(rows, reference, prompt_sets, cfg, meter: ForwardMeter, device: torch.device,
            console: Console) -> list[dict]:
    """One record per timed generation. `reference` is the HF plain row (identity at temperature 0);
    at temperature > 0 rows with the coupled sampler are checked against the coupled autoregressive row."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    records: list[dict] = []
    plan = [(t, s) for t in cfg.temperatures for s in (cfg.seeds if t > 0 else cfg.seeds[:1])]
    regular = {name: prompts for name, prompts in prompt_sets.items() if name != "samples"}
    samples = prompt_sets.get("samples", [])
    per_sample = cfg.prompts.samples + 1          # the sampled requests, then the edited greedy one
    total = len(rows) * (cfg.repeats * len(plan) * sum(len(p) for p in regular.values()) + per_sample * len(samples))
    first_prompt = next(iter(prompt_sets.values()))[0]
    coupled = coupled_rows(rows)      # sampled outputs identical to the coupled autoregressive row's
    step = 0

    def run_rows(set_name, prompt, token_ids, temperature, seed, repeat, extra=None):
        """Every row once on token_ids, the row order rotated per call; the identity checks."""
        nonlocal step
        shift = step % len(rows)
        step += 1
        outputs = {}
        for row in rows[shift:] + rows[:shift]:
            progress.update(task, description=f"T={temperature:g} {set_name}#{prompt.index} {row.label}")
            generation, record = timed_generation(row, token_ids, cfg.max_new_tokens, temperature, seed, meter, sync,
                                                  prompt_set=set_name, prompt_index=prompt.index, repeat=repeat,
                                                  **(extra or {}))
            outputs[row.label] = generation.token_ids
            records.append(record)
            progress.advance(task)
        if cfg.progress and not console.is_terminal:   # a log file: a line per prompt
            console.print(f"T={temperature:g} {set_name}#{prompt.index} seed {seed}: "
                          f"{len(records)}/{total} generations done")
        if temperature == 0:
            _check_identity(records[-len(rows):], outputs, reference.label, console, reference.target, token_ids)
        elif coupled:
            _check_identity([r for r in records[-len(rows):] if r["row"] in coupled], outputs, coupled[0], console)

    with _progress(cfg.progress, console) as progress:
        task = progress.add_task("warm-up", total=total)
        temperatures = list(cfg.temperatures) if regular else []
        warm = temperatures + ([cfg.prompts.samples_temperature, 0.0] if samples else [])
        for temperature in dict.fromkeys(warm):
            if cfg.warmup_tokens > 0:
                for row in rows:
                    progress.update(task, description=f"warm-up T={temperature:g} {row.label}")
                    row.generate(first_prompt.token_ids, min(cfg.warmup_tokens, cfg.max_new_tokens), temperature,
                                 cfg.seeds[0])
        for temperature in temperatures:
            seeds = cfg.seeds if temperature > 0 else cfg.seeds[:1]
            for set_name, prompts in regular.items():
                for prompt in prompts:
                    for seed in seeds:
                        for repeat in range(cfg.repeats):
                            run_rows(set_name, prompt, prompt.token_ids, temperature, seed, repeat)
        if samples:
            # arrival order, as the traffic it stands for: a prompt's samples one after another, then
            # its edited request; what earlier calls cached (warm-up, other sets) is forgotten first,
            # so the first sample of a prompt has nothing of that prompt to reuse
            for row in rows:
                row.forget()
            for prompt in samples:
                for index in range(cfg.prompts.samples):
                    run_rows("samples", prompt, prompt.token_ids, cfg.prompts.samples_temperature, index, 0,
                             {"sample_index": index})
                run_rows("samples", prompt, prompt.edited, 0.0, cfg.seeds[0], 0,
                         {"sample_index": cfg.prompts.samples, "edited": True})
    return records


def timed_generation(row, token_ids: list[int], max_new_tokens: int, temperature: float, seed: int,
                     meter: ForwardMeter, sync, **fields) -> tuple[Generation, dict]:
    """One timed generation of `row`, and its record: `fields` (where the prompt came from) and what was
    measured (new tokens, wall time, the forwards `meter` counted, our loop's stats); identity unchecked."""
    with meter.tally() as tally:
        sync()
        start = time.perf_counter()
        generation = row.generate(token_ids, max_new_tokens, temperature, seed)
        sync()
        elapsed = time.perf_counter() - start
    return generation, {"row": row.label, "kind": row.kind, **fields, "prompt_tokens": len(token_ids),
                        "temperature": temperature, "seed": seed, "new_tokens": len(generation.token_ids),
                        "time_s": elapsed, "forwards": tally.as_dict(), "stats": generation.stats,
                        "identical": None, "first_mismatch": None, "difference": None}


def coupled_rows(rows) -> list[str]:
    """Labels of our rows with the coupled sampler, the autoregressive one first (the reference of
    their sampled-identity check); [] when there is no coupled autoregressive row."""
    labels = [r.label for r in rows if r.kind == "specdec" and r.info.get("sampler") == "coupled"]
    reference = [r.label for r in rows if r.label in labels and r.info.get("strategy") == "autoregressive"]
    return reference[:1] + [label for label in labels if label not in reference[:1]] if reference else []


def _check_identity(batch: list[dict], outputs: dict, reference_label: str, console: Console, target=None,
                    prompt_ids: list[int] | None = None) -> None:
    """Set each record's identity fields against the reference row's output. With `target` (greedy
    rows, all on `prompt_ids`) a difference is classified at its first differing token by one plain
    target forward (benchmarks/ties.py); without (sampled rows) every difference is a mismatch."""
    expected = outputs[reference_label]
    for record in batch:
        tokens = outputs[record["row"]]
        at = first_divergence(tokens, expected)
        record["identical"] = at is None
        record["first_mismatch"] = at
        if at is None:
            continue
        if target is not None:      # processed as every row's generation_config processes it
            difference = classify(target, prompt_ids, tokens, expected, shared_generation_config(target))
        else:
            difference = unclassified(at)
        record["difference"] = difference
        where = (f"row {record['row']!r} differs from {reference_label!r} (T={record['temperature']:g}) on "
                 f"{record['prompt_set']} prompt #{record['prompt_index']} ")
        if difference["excused"]:
            console.print(f"[yellow]identity: {where}{describe(difference)}: excused in {difference['dtype']}[/]")
        else:
            console.print(f"[bold red]IDENTITY MISMATCH[/]: {where}"
                          + (describe(difference) if target is not None else f"at new token {at}"))
