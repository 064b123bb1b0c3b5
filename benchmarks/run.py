"""`specdec bench <preset or yaml> key=value ...`: every strategy against Hugging Face's own
generate(), side by side in one process, on the same models and prompts.

Writes into output_dir: results.json (every raw number, the settings, the machine), results.md
(the tables), speedup.png and tokens_per_forward_sweep.png; with write_readme=true it also
rewrites this preset's marked section of benchmarks/README.md."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys

from rich.console import Console

from specdec.config import load_spec_config, parse_overrides
from specdec.errors import ConfigError, SpecDecError
from specdec.models import context_length, load_model, load_tokenizer, resolve_device, resolve_dtype

from .config import as_plain, load_bench_config
from .machine import machine_info, machine_line
from .meter import ForwardMeter, watch_rows
from .peers import HFRow, build_peer_rows
from .plots import pyplot, write_plots
from .prompts import build_prompt_sets
from .questions import code_questions, load_questions, write_questions
from .report import (COLUMNS_HELP, markdown_tables, readme_section, rewrite_marked_section, samples_by_index,
                     samples_table, summarize, write_json)
from .rows import build_specdec_rows
from .runner import run_all
from . import specbench

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdec bench", description=__doc__.split("\n\n")[0],
                                     epilog="e.g. specdec bench quick models.target=/m/target "
                                            "models.draft=/m/draft output_dir=out")
    parser.add_argument("preset", help="a preset in configs/bench (quick, full, specbench questions=FILE, ...) or a YAML "
                        "path; `specdec bench serve --help`: the server under concurrent clients; `specdec bench "
                        "questions --help`: a Spec-Bench question file of held-out code")
    parser.add_argument("overrides", nargs="*", help="key=value (values parsed as YAML), e.g. prompts.num=2 max_new_tokens=64 "
                                                     "only=[autoregressive,draft]")
    return parser.parse_args(argv)


FAMILY_PARTS = ("target", "draft", "heads", "eagle", "tokenizer")


def _resolve_models(models, prompts) -> None:
    """models.dir fills every part it holds that is not given; no target at all: the embedded default
    family (its builder says what to do when absent). A family's split.json becomes prompts.split when
    none is given, so the prompts come from files its models never saw."""
    split = None
    if models.dir is not None:
        if not os.path.isdir(os.path.join(models.dir, "target")):
            raise ConfigError(f"models.dir={models.dir!r} has no target/ folder: give a family folder "
                              f"(DIR/target, DIR/draft, ...) or models.target=PATH")
        for role in FAMILY_PARTS:
            part = os.path.join(models.dir, role)
            if getattr(models, role) is None and os.path.isdir(part):
                setattr(models, role, part)
        split = os.path.join(models.dir, "split.json")
    elif models.target is None:
        from specdec.family.defaults import SPLIT_FILE, apply_default_paths
        cfg = load_spec_config("autoregressive")
        family = apply_default_paths(cfg)
        models.target = cfg.target.path
        models.draft = models.draft or cfg.draft.path
        models.heads = models.heads or cfg.heads.path
        models.eagle = models.eagle or cfg.eagle.path
        split = os.path.join(family.tokenizer, SPLIT_FILE)
    if prompts.split is None and prompts.source_dir is None and split is not None and os.path.isfile(split):
        prompts.split = split
        with open(split) as f:
            prompts.source_dir = json.load(f).get("root")     # None: this Python's standard library
    for role in FAMILY_PARTS:
        path = getattr(models, role)
        if path is not None and not os.path.exists(path):
            raise ConfigError(f"models.{role}={path!r} does not exist: give the folder of the {role} "
                              f"(or models.{role}=null{' to skip its rows' if role in ('draft', 'heads', 'eagle') else ''})")


def _plain_reference(peer_rows, target, notes) -> HFRow:
    """HF plain generate() is the reference of every ratio and of the identity check: always run it."""
    for row in peer_rows:
        if row.entry.kind == "plain":
            return row
    from omegaconf import OmegaConf
    from .config import PeerEntry
    entry = OmegaConf.structured(PeerEntry(label="HF generate()", kind="plain"))
    notes.append("no plain HF peer configured: added 'HF generate()' as the reference row")
    row = HFRow(entry.label, target, entry, None, {"kind": "plain"})
    peer_rows.insert(0, row)
    return row


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":            # the server under concurrent clients (benchmarks/serve.py)
        from .serve import main as serve_main
        return serve_main(argv[1:])
    if argv and argv[0] == "questions":        # a Spec-Bench question file of held-out code
        return _questions_main(argv[1:])
    args = _parse(argv)
    cfg = load_bench_config(args.preset, parse_overrides(args.overrides))
    questions = load_questions(cfg.questions) if cfg.questions else None   # a bad file stops us before any model loads
    pyplot()                         # before any model runs: matplotlib (specdec[bench]) is there for the plots
    console = Console(stderr=True)
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    if cfg.threads:
        import torch
        torch.set_num_threads(cfg.threads)
    _resolve_models(cfg.models, cfg.prompts)
    device = resolve_device(cfg.models.device)
    dtype = resolve_dtype(cfg.models.dtype, device)
    target = load_model(cfg.models.target, "target", device, dtype, key="models.target")
    tokenizer = load_tokenizer(cfg.models.tokenizer or cfg.models.target, "target", key="models.tokenizer")
    draft = load_model(cfg.models.draft, "draft", device, dtype, key="models.draft") if cfg.models.draft else None

    notes: list[str] = []
    rows = build_specdec_rows(cfg.strategies, cfg.models, target, tokenizer, device, dtype, notes)
    peer_rows = build_peer_rows(cfg.peers, target, draft, notes)
    reference = _plain_reference(peer_rows, target, notes)
    rows += peer_rows
    if cfg.only:
        rows = [r for r in rows if r is reference or any(part in r.label for part in cfg.only)]
    if cfg.questions:
        rows = specbench.question_rows(rows, notes)
    baseline = next((r.label for r in rows if r.kind == "specdec" and r.info["strategy"] == "autoregressive"), None)
    if baseline is None:
        notes.append("no autoregressive row: the '× AR' column is empty")
    for note in notes:
        console.print(f"[yellow]note[/]: {note}")

    meter = ForwardMeter(device)
    watch_rows(meter, target, rows)

    context = context_length(target, tokenizer) or 10 ** 9
    if cfg.questions:             # Spec-Bench's questions, turn by turn (benchmarks/specbench.py)
        prompt_sets = {}
        records = specbench.run_questions(rows, reference, questions, cfg, meter, device, tokenizer,
                                          context - cfg.max_new_tokens, console)
    else:
        prompt_sets = build_prompt_sets(cfg.prompts, tokenizer, context - cfg.max_new_tokens)
        if cfg.batch_sizes:
            return _batch_main(cfg, argv, rows, reference, baseline, prompt_sets, device, dtype, notes, console)
        records = run_all(rows, reference, prompt_sets, cfg, meter, device, console)
    meter.close()

    summary = summarize(records, rows, baseline, reference.label)
    mismatches = sum(e["identity"]["mismatches"] for e in summary if e["identity"])
    excused = sum(e["identity"]["ties"] + e["identity"]["near_ties"] for e in summary if e["identity"])
    os.makedirs(cfg.output_dir, exist_ok=True)
    by_index = samples_by_index(records, baseline)
    plots = write_plots(summary, cfg.output_dir, reference.label, by_index, baseline)
    tables = markdown_tables(summary, reference.label, baseline) + "\n" + samples_table(
        by_index, baseline, cfg.prompts.samples_temperature)
    machine = machine_info(device, dtype)
    command = "specdec bench " + shlex.join(argv)
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    answers = None
    if cfg.questions:
        answers, figures = specbench.write_answers(records, rows, reference.label, cfg, dtype,
                                                   cfg.models.tokenizer or cfg.models.target)
        tables += "\n" + figures
    payload = {
        "command": command, "date": when, "settings": as_plain(cfg), "machine": machine, "notes": notes,
        "reference_row": reference.label, "baseline_row": baseline, "identity_mismatches": mismatches,
        "identity_excused": excused,
        "rows": [{"label": r.label, "kind": r.kind, **r.info} for r in rows],
        "prompts": {name: [{"index": p.index, "tokens": len(p.token_ids), **p.source} for p in prompts]
                    for name, prompts in prompt_sets.items()},
        "summary": summary, "samples_by_index": by_index, "records": records, "plots": [os.path.basename(p) for p in plots],
    }
    if answers is not None:
        payload["specbench"] = answers
    write_json(os.path.join(cfg.output_dir, "results.json"), payload)
    with open(os.path.join(cfg.output_dir, "results.md"), "w") as fh:
        fh.write(f"# `{cfg.name}` benchmark\n\n`{command}` — {when}\n\nMachine: {machine_line(machine)}\n\n")
        fh.write("".join(f"* note: {n}\n" for n in notes) + "\n" + tables + "\n" + COLUMNS_HELP + "\n")
    if cfg.write_readme:
        readme = cfg.readme or README
        rewrite_marked_section(readme, cfg.name, readme_section(cfg.name, command, machine_line(machine), tables,
                                                                plots, notes, os.path.dirname(os.path.abspath(readme)), when))
    console.print(tables, markup=False, highlight=False, soft_wrap=True)
    console.print(f"results in {cfg.output_dir}/ (results.json, results.md, {', '.join(os.path.basename(p) for p in plots)})")
    if excused:
        console.print(f"[yellow]{excused} output(s) part from their reference at a tie or near tie of the target's "
                      f"logits in {machine['dtype']}: excused in half precision (docs/sampling.md)[/]")
    if mismatches:
        console.print(f"[bold red]{mismatches} output(s) differ from their reference beyond a tie in the model's dtype: "
                      f"speculative decoding must be lossless — see the 'same' column[/]")
        return 3
    return 0


def _questions_main(argv: list[str]) -> int:
    """`specdec bench questions OUT [key=value ...]`: Spec-Bench questions cut from held-out code
    (benchmarks/questions.code_questions), with the specbench preset's models and prompts settings."""
    parser = argparse.ArgumentParser(prog="specdec bench questions",
                                     description="Write a Spec-Bench question file (question_id, category, turns) "
                                                 "of held-out code: `code` windows to continue and two-turn `repeat` "
                                                 "questions.", epilog="e.g. specdec bench questions "
                                                 "code_questions.jsonl models.dir=MODELS/pycode prompts.num=4")
    parser.add_argument("out", help="the question file to write (.jsonl)")
    parser.add_argument("overrides", nargs="*", help="key=value of the specbench preset: models.dir, models.target, "
                                                     "models.tokenizer, prompts.num / tokens / seed / split / source_dir")
    args = parser.parse_args(argv)
    cfg = load_bench_config("specbench", parse_overrides(args.overrides))
    _resolve_models(cfg.models, cfg.prompts)
    tokenizer = load_tokenizer(cfg.models.tokenizer or cfg.models.target, "target", key="models.tokenizer")
    questions = code_questions(cfg.prompts, tokenizer)
    write_questions(args.out, questions)
    where = f"the held-out list of {cfg.prompts.split}" if cfg.prompts.split else "a seeded split"
    print(f"{len(questions)} questions ({cfg.prompts.num} code, {cfg.prompts.num} repeat) from {where} -> {args.out}")
    return 0


def _batch_main(cfg, argv, rows, reference, baseline, prompt_sets, device, dtype, notes, console) -> int:
    """The batch benchmark (a preset with batch_sizes): every prompt of every set in one list."""
    from .batch import batch_plot, batch_rows, batch_table, run_batches
    prompts = [p.token_ids for prompts in prompt_sets.values() for p in prompts]
    rows = batch_rows(rows)
    records = run_batches(rows, prompts, cfg, console)
    os.makedirs(cfg.output_dir, exist_ok=True)
    plots = batch_plot(records, cfg.output_dir)
    table = batch_table(records, reference.label, baseline)
    machine = machine_info(device, dtype)
    command = "specdec bench " + shlex.join(argv)
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    write_json(os.path.join(cfg.output_dir, "results.json"),
               {"command": command, "date": when, "settings": as_plain(cfg), "machine": machine, "notes": notes,
                "records": records, "plots": [os.path.basename(p) for p in plots]})
    with open(os.path.join(cfg.output_dir, "results.md"), "w") as fh:
        fh.write(f"# `{cfg.name}` benchmark\n\n`{command}` — {when}\n\nMachine: {machine_line(machine)}\n\n"
                 f"{len(prompts)} prompts, {cfg.max_new_tokens} new tokens each; total tokens/s of the whole list.\n\n")
        fh.write("".join(f"* note: {n}\n" for n in notes) + "\n" + table + "\n")
    console.print(table, markup=False, highlight=False, soft_wrap=True)
    console.print(f"results in {cfg.output_dir}/")
    wrong = sum(r["identity"]["mismatches"] for r in records if r["identical"] is False)
    if wrong:
        console.print(f"[bold red]{wrong} output(s) differ from our batched autoregressive's beyond a tie in the "
                      f"model's dtype — see the 'same as AR' column[/]")
    return 3 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecDecError as exc:
        print(f"specdec bench: error: {exc}", file=sys.stderr)
        sys.exit(2)
