"""Spec-Bench's question files (`question.jsonl`: one {"question_id", "category", "turns"} per line):
reading one, building a turn's prompt the way Spec-Bench's scripts do, and making a code question
set of the same schema from held-out files (`specdec bench questions OUT ...`).

A turn's prompt is the conversation so far: turn 1, its answer, ..., turn j. Spec-Bench puts it in
Vicuna's conversation template (evaluation/eval.py); here it goes through the tokenizer's own chat
template when it has one (a user message per turn, an assistant message per answer, then the
generation prompt), answers stripped as Spec-Bench strips them. A tokenizer without a chat template
(a base model, the pycode family) has no roles to put the turns in: the prompt is then the
conversation's texts concatenated as they are (turn 1, answer 1, turn 2, ...), the document a base
model continues; a question file puts whatever separator it wants at the start of a turn's text.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

from specdec.atomic import atomic_write_text
from specdec.errors import InputError

from .prompts import _TokenizedFiles, _windows, heldout_files, stdlib_dir

# the second turn of a `repeat` question: the model's answer to it is largely a copy of turn 1 and
# its answer, as MT-bench's second turns ask to rework the first answer
REPEAT_TURN = "\n\n# The same code again:\n"


@dataclass
class Question:
    question_id: int | str
    category: str
    turns: list[str]


def load_questions(path: str, limit: int | None = None) -> list[Question]:
    """The questions of a Spec-Bench question file, in file order (the first `limit` when given)."""
    if not os.path.isfile(path):
        raise InputError(f"questions={path!r} does not exist: give a Spec-Bench question file "
                         f"(data/spec_bench/question.jsonl of their repository, or `specdec bench questions OUT`)")
    questions = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                question = Question(item["question_id"], str(item["category"]), list(item["turns"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InputError(f"{path}:{line_no}: each line must be a JSON object with question_id, category "
                                 f"and turns (a list of strings), as Spec-Bench's question.jsonl ({exc!r})") from exc
            if not question.turns or not all(isinstance(t, str) and t for t in question.turns):
                raise InputError(f"{path}:{line_no}: turns must be a non-empty list of non-empty strings")
            questions.append(question)
            if limit is not None and len(questions) == limit:
                break
    if not questions:
        raise InputError(f"questions={path!r} holds no questions")
    ids = [q.question_id for q in questions]
    if len(set(map(str, ids))) != len(ids):
        raise InputError(f"{path}: question_id values repeat; Spec-Bench keys answers by them")
    return questions


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def turn_prompt(tokenizer, turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of the prompt of turn len(answers) + 1: turns[:len(answers) + 1] with the answers
    given so far (see the module's docstring for a tokenizer without a chat template)."""
    asked = turns[: len(answers) + 1]
    if has_chat_template(tokenizer):
        messages = []
        for j, turn in enumerate(asked):
            messages.append({"role": "user", "content": turn})
            if j < len(answers):
                messages.append({"role": "assistant", "content": answers[j]})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])   # the template holds its specials
    text = "".join(part for pair in zip(asked, answers + [""]) for part in pair)
    return list(tokenizer(text)["input_ids"])                # as Spec-Bench's tokenizer([prompt]) does


def answer_text(tokenizer, token_ids: list[int]) -> str:
    """A turn's answer as Spec-Bench stores it: decoded without special tokens, stripped where a chat
    template wraps it (its roles own the whitespace around it); as generated without one, where the
    answer continues the text and the next turn continues the answer."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return text.strip() if has_chat_template(tokenizer) else text


def code_questions(prompts_cfg, tokenizer) -> list[dict]:
    """Spec-Bench questions from held-out code (prompts.split's held-out list, else a seeded split of
    prompts.source_dir): `code`, a window of prompts.tokens tokens to continue (one turn); `repeat`,
    another window, then REPEAT_TURN (two turns). prompts.num of each, question ids from 1."""
    source_dir = prompts_cfg.source_dir or stdlib_dir()
    files = heldout_files(source_dir, prompts_cfg.split, prompts_cfg.heldout_fraction, prompts_cfg.seed)
    reader = _TokenizedFiles(source_dir, tokenizer)
    questions = []
    for category, turns_after in (("code", []), ("repeat", [REPEAT_TURN])):
        rng = random.Random(f"questions-{category}-{prompts_cfg.seed}")
        for name, start, ids in _windows(files, reader, prompts_cfg.tokens, prompts_cfg.num, rng):
            questions.append({"question_id": len(questions) + 1, "category": category,
                              "turns": [tokenizer.decode(ids)] + turns_after, "source": {"file": name, "start_token": start}})
    return questions


def write_questions(path: str, questions: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(q) + "\n" for q in questions))
