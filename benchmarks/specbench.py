"""The bench on a Spec-Bench question file (`questions=PATH`): every row answers every question turn
after turn, as Spec-Bench's evaluation/eval.py does, and each row's answers are written as
`output_dir/model_answer/<model id>.jsonl` in Spec-Bench's answer schema, so that their
evaluation/speed.py reads them (scripts/interop/specbench_speed.py runs it and checks its figures
against ours).

Spec-Bench's figures, computed here as their speed() computes them: a question's speed is its new
tokens over its wall time (summed over its turns); a row's tokens/s is the mean of its questions'
speeds; the speed-up is that over the same mean of the Hugging Face plain row (their "vanilla"
baseline); the mean accepted tokens is the mean over every decoding step of the tokens it yielded.
Their speed() counts the baseline's tokens by tokenizing its answer texts again (minus one for a
BOS); ours counts the tokens generated, which the answer files also hold (`new_tokens`).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import time
import uuid
from collections import defaultdict

import torch

from specdec.atomic import atomic_write_text
from specdec.check import first_divergence
from specdec.errors import ConfigError

from .questions import answer_text, turn_prompt
from .runner import _check_identity, _progress, coupled_rows, timed_generation
from .ties import unclassified

ANSWERS_DIR = "model_answer"


def model_prefix(models) -> str:
    """The model part of the answer files' ids: the family folder's name, else the target folder's
    (its parent's when the folder is a family's `target/`)."""
    path = os.path.normpath(models.dir or models.target)
    name = os.path.basename(path)
    return os.path.basename(os.path.dirname(path)) if name == "target" and not models.dir else name


def model_id(prefix: str, row, dtype: str, temperature: float) -> str:
    """Spec-Bench's naming (their baseline: vicuna-7b-v1.3-vanilla-float16-temp-0.0): the plain HF row
    is `vanilla`, ours the row label in lower case with runs of other characters as one '-'."""
    method = "vanilla" if row.kind == "hf" else re.sub(r"[^a-z0-9.]+", "-", row.label.lower()).strip("-")
    return f"{prefix}-{method}-{dtype}-temp-{float(temperature)}"


def answer_ids(rows, prefix: str, dtype: str, temperatures) -> dict[tuple, str]:
    """{(row label, temperature): model id}; two rows whose labels give one id are refused (their
    answers would land in one file)."""
    ids = {(row.label, t): model_id(prefix, row, dtype, t) for row in rows for t in temperatures}
    seen: dict[str, str] = {}
    for (label, _), name in ids.items():
        if seen.setdefault(name, label) != label:
            raise ConfigError(f"rows {seen[name]!r} and {label!r} would write the same answer file {name}.jsonl: "
                              f"give one of them another label")
    return ids


def question_rows(rows, notes: list[str]) -> list:
    """Our rows and HF's plain generate(); HF's assisted rows do not say how many tokens each of their
    forwards yielded, which Spec-Bench's accept_lengths holds: left out, with a note."""
    kept = []
    for row in rows:
        if row.kind == "hf" and row.entry.kind != "plain":
            notes.append(f"row {row.label!r} left out: Spec-Bench's answers need the tokens of each decoding step, "
                         f"which Hugging Face's {row.entry.kind} generate() does not report")
            continue
        kept.append(row)
    return kept


def tokens_per_step(accepted_lengths: list[int], new_tokens: int) -> list[int]:
    """Tokens each verify step yielded: its accepted drafted tokens plus the target's own one; only a
    call's last step is cut (where it stopped: max_new_tokens, EOS, a stop string)."""
    steps = [accepted + 1 for accepted in accepted_lengths]
    cut = sum(steps) - new_tokens
    if not steps or not 0 <= cut < steps[-1]:
        raise ValueError(f"steps accepting {accepted_lengths} drafted tokens cannot have yielded {new_tokens} tokens")
    steps[-1] -= cut
    return steps


def run_questions(rows, reference, questions, cfg, meter, device: torch.device, tokenizer, max_prompt_tokens: int,
                  console) -> list[dict]:
    """One record per (row, question, turn, temperature): the bench's record (prompt_set = the
    question's category, prompt_index = its id) plus the turn, its answer text and its tokens per step.
    Rows run question by question, their order rotating from question to question; each row answers
    a question's turns one after the other, each turn's prompt built from its own earlier answers."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    records: list[dict] = []
    coupled = coupled_rows(rows)
    total = len(rows) * len(cfg.temperatures) * sum(len(q.turns) for q in questions)
    seed = cfg.seeds[0]

    def prompt_ids(question, answers: list[str]) -> tuple[list[int], dict]:
        ids = turn_prompt(tokenizer, question.turns, answers)
        if len(ids) <= max_prompt_tokens:
            return ids, {}
        return ids[-max_prompt_tokens:], {"truncated_from": len(ids)}   # keep the end: it is what is continued

    with _progress(cfg.progress, console) as progress:
        task = progress.add_task("warm-up", total=total)
        for step, temperature in enumerate(cfg.temperatures):
            if cfg.warmup_tokens > 0:
                first = prompt_ids(questions[0], [])[0]
                for row in rows:
                    progress.update(task, description=f"warm-up T={temperature:g} {row.label}")
                    row.generate(first, min(cfg.warmup_tokens, cfg.max_new_tokens), temperature, seed)
            for q_index, question in enumerate(questions):
                shift = (step * len(questions) + q_index) % len(rows)
                outputs: dict[int, dict[str, list[int]]] = defaultdict(dict)    # turn -> row -> new tokens
                asked: dict[int, dict[str, list[int]]] = defaultdict(dict)      # turn -> row -> its prompt
                start_at = len(records)
                for row in rows[shift:] + rows[:shift]:
                    answers: list[str] = []
                    for turn in range(len(question.turns)):
                        progress.update(task, description=f"T={temperature:g} q{question.question_id}.{turn + 1} "
                                                          f"{row.label}")
                        ids, truncated = prompt_ids(question, answers)
                        generation, record = timed_generation(
                            row, ids, cfg.max_new_tokens, temperature, seed, meter, sync, prompt_set=question.category,
                            prompt_index=question.question_id, question_id=question.question_id, turn=turn, repeat=0,
                            **truncated)
                        new = generation.token_ids
                        record["step_tokens"] = ([1] * len(new) if generation.stats is None
                                                 else tokens_per_step(generation.accepted_lengths, len(new)))
                        record["answer"] = answer_text(tokenizer, new)
                        answers.append(record["answer"])
                        outputs[turn][row.label] = new
                        asked[turn][row.label] = ids
                        records.append(record)
                        progress.advance(task)
                for turn, by_row in outputs.items():
                    batch = [r for r in records[start_at:] if r["turn"] == turn]
                    if temperature == 0:
                        prompt = asked[turn][reference.label]
                        _check_identity([r for r in batch if asked[turn][r["row"]] == prompt], by_row, reference.label,
                                        console, reference.target, prompt)
                        _carry_identity([r for r in batch if asked[turn][r["row"]] != prompt], by_row, reference.label,
                                        records[start_at:])
                    elif coupled:
                        _check_identity([r for r in batch if r["row"] in coupled], by_row, coupled[0], console)
    return records


def _carry_identity(batch: list[dict], outputs: dict, reference_label: str, question_records: list[dict]) -> None:
    """Greedy records whose prompt for this turn is not the reference's, because an earlier answer
    already parted from it: their tokens are compared, but a difference is not classified again (the
    two outputs continue different texts); it keeps the verdict of the turn where the answers parted,
    with `from_turn` naming that turn."""
    for record in batch:
        at = first_divergence(outputs[record["row"]], outputs[reference_label])
        record["identical"] = at is None
        record["first_mismatch"] = at
        if at is None:
            continue
        parted = max((r for r in question_records if r["row"] == record["row"] and r["turn"] < record["turn"]
                      and r["difference"] is not None), key=lambda r: r["turn"], default=None)
        if parted is None:          # the prompts differ, yet no earlier answer did: nothing to excuse it
            record["difference"] = unclassified(at)
        else:
            record["difference"] = {**parted["difference"], "from_turn": parted["difference"].get("from_turn",
                                                                                                  parted["turn"])}


def answer_files(records: list[dict], ids: dict[tuple, str], output_dir: str) -> dict[str, str]:
    """Write each (row, temperature)'s answers, one line per question in the order they ran, to
    output_dir/model_answer/<model id>.jsonl, in Spec-Bench's schema (evaluation/eval.py's
    get_model_answers: one choice, lists per turn, accept_lengths over every step of every turn).
    Returns {model id: path}."""
    by_answer: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        by_answer[(record["row"], record["temperature"], record["question_id"])].append(record)
    lines: dict[str, list[str]] = defaultdict(list)
    for (row, temperature, question_id), turns in by_answer.items():
        turns.sort(key=lambda r: r["turn"])
        decoding_steps = [len(r["step_tokens"]) for r in turns]
        choice = {"index": 0, "turns": [r["answer"] for r in turns], "decoding_steps": decoding_steps,
                  "new_tokens": [r["new_tokens"] for r in turns], "wall_time": [r["time_s"] for r in turns],
                  "accept_lengths": [n for r in turns for n in r["step_tokens"]]}
        answer = {"question_id": question_id, "category": turns[0]["prompt_set"], "answer_id": uuid.uuid4().hex,
                  "model_id": ids[(row, temperature)], "choices": [choice], "tstamp": time.time()}
        lines[ids[(row, temperature)]].append(json.dumps(answer))
    paths = {}
    for name, file_lines in lines.items():
        paths[name] = os.path.join(output_dir, ANSWERS_DIR, f"{name}.jsonl")
        atomic_write_text(paths[name], "".join(line + "\n" for line in file_lines))
    return paths


def figures(records: list[dict], labels: list[str], reference_label: str) -> list[dict]:
    """Spec-Bench's figures per (temperature, row, task): each category, then "overall" (see the
    module's docstring), the reference being the plain HF row of the same temperature."""
    per_question: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        per_question[(record["temperature"], record["row"], record["question_id"])].append(record)
    out = []
    for temperature in dict.fromkeys(r["temperature"] for r in records):
        tasks = list(dict.fromkeys(r["prompt_set"] for r in records)) + ["overall"]

        def answers(label, task):
            return [turns for (t, row, _), turns in per_question.items()
                    if t == temperature and row == label and (task == "overall" or turns[0]["prompt_set"] == task)]

        def tokens_per_second(label, task):
            speeds = [sum(r["new_tokens"] for r in turns) / sum(r["time_s"] for r in turns)
                      for turns in answers(label, task)]
            return statistics.fmean(speeds) if speeds else None

        for label in labels:
            for task in tasks:
                steps = [n for turns in answers(label, task) for r in turns for n in r["step_tokens"]]
                if not steps:
                    continue
                speed, base = tokens_per_second(label, task), tokens_per_second(reference_label, task)
                out.append({"temperature": temperature, "row": label, "task": task, "questions": len(answers(label, task)),
                            "tokens_per_second": speed, "baseline_tokens_per_second": base,
                            "speedup": speed / base if base else None,
                            "mean_accepted_tokens": statistics.fmean(steps)})
    return out


def figures_table(entries: list[dict], ids: dict[tuple, str]) -> str:
    lines = ["#### Spec-Bench's figures (evaluation/speed.py's definitions, from the answer files' counts)", "",
             "| row | answer file (model id) | task | questions | tok/s (mean over questions) | speed-up over "
             "`vanilla` | mean accepted tokens |", "|---|---|---|---:|---:|---:|---:|"]
    for e in entries:
        lines.append(f"| `{e['row']}` | `{ids[(e['row'], e['temperature'])]}` | {e['task']} | {e['questions']} | "
                     f"{e['tokens_per_second']:.1f} | {e['speedup']:.2f} | {e['mean_accepted_tokens']:.2f} |")
    return "\n".join(lines) + "\n"


def write_answers(records: list[dict], rows, reference_label: str, cfg, dtype: torch.dtype,
                  tokenizer_path: str) -> tuple[dict, str]:
    """The answer files, and (what results.json keeps of them, the figures' table): each answer file
    with its model id, row, temperature and its baseline's file; the figures; the tokenizer folder
    (what Spec-Bench's speed() tokenizes the baseline's answers with)."""
    prefix = cfg.model_id or model_prefix(cfg.models)
    dtype_name = str(dtype).removeprefix("torch.")
    ids = answer_ids(rows, prefix, dtype_name, cfg.temperatures)
    paths = answer_files(records, ids, cfg.output_dir)
    entries = figures(records, [row.label for row in rows], reference_label)
    for entry in entries:
        entry["model_id"] = ids[(entry["row"], entry["temperature"])]
    files = [{"model_id": ids[(row.label, t)], "row": row.label, "temperature": t,
              "file": os.path.relpath(paths[ids[(row.label, t)]], cfg.output_dir),
              "baseline_file": os.path.relpath(paths[ids[(reference_label, t)]], cfg.output_dir)}
             for t in cfg.temperatures for row in rows]
    part = {"questions": cfg.questions, "tokenizer": tokenizer_path, "answer_files": files, "figures": entries}
    return part, figures_table(entries, ids)
