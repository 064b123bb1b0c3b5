"""Prompt sets made at run time from text on this machine (nothing is downloaded).

* code     — prompts of N tokens cut at seeded random places from held-out Python files;
* grounded — the continuation largely repeats the prompt: a snippet, then the start of the same
             snippet again (or of the snippet with one identifier renamed): prompt lookup's case;
* noise    — a code window with its tokens shuffled (seeded): text that nothing can predict, where
             a strategy should cost nothing over plain decoding;
* samples  — repeated traffic (pass@k, best-of-n, an agent editing a file): held-out code windows,
             each requested `prompts.samples` times at `prompts.samples_temperature` (seeds 0, 1, ...),
             then once more greedy with one line of the prompt edited; what suffix decoding is for
             (the runner runs this set in arrival order, see benchmarks/runner.run_samples);
* jsonl    — a user's file of {"prompt": "..."} lines.
"""
from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from specdec.errors import ConfigError, InputError


@dataclass
class Prompt:
    set_name: str
    index: int
    token_ids: list[int]
    source: dict = field(default_factory=dict)    # where it came from (file, offset, kind)
    edited: list[int] | None = None               # samples set: the prompt with one line edited


def stdlib_dir() -> str:
    return os.path.dirname(os.__file__)


def _all_python_files(root: str) -> list[str]:
    """Every .py file under root outside test folders and idlelib, relative and sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idlelib", "site-packages", "__pycache__")
                         and not d.startswith("lib2to3"))
        found += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".py")]
    return sorted(found)


def heldout_files(source_dir: str, split: str | None, fraction: float, seed: int) -> list[str]:
    """The held-out list of a split file, else a fixed seeded split of the folder's Python files."""
    if split:
        if not os.path.isfile(split):
            raise ConfigError(f"prompts.split={split!r} does not exist: give a JSON file with a 'heldout' list, "
                              f"or prompts.split=null for a seeded split of prompts.source_dir")
        with open(split) as fh:
            names = json.load(fh).get("heldout")
        if not names:
            raise ConfigError(f"prompts.split={split!r} has no 'heldout' list of files")
        return sorted(names)
    files = _all_python_files(source_dir)
    if not files:
        raise ConfigError(f"no .py files under prompts.source_dir={source_dir!r}")
    random.Random(seed).shuffle(files)
    return sorted(files[: max(1, round(len(files) * fraction))])


class _TokenizedFiles:
    """Files of a folder, read and tokenized once each."""

    def __init__(self, root: str, tokenizer):
        self.root, self.tokenizer, self._ids = root, tokenizer, {}

    def ids(self, name: str) -> list[int]:
        if name not in self._ids:
            path = os.path.join(self.root, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                text = ""
            self._ids[name] = self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        return self._ids[name]


def _windows(files: list[str], reader: _TokenizedFiles, length: int, count: int, rng: random.Random):
    """`count` (file, start, ids) windows of `length` tokens, one file after another in a seeded
    order (files reused only when there are too few long enough)."""
    order = list(files)
    rng.shuffle(order)
    long_enough = [f for f in order if len(reader.ids(f)) > length]
    if not long_enough:
        raise InputError(f"no held-out file has more than {length} tokens: lower prompts.tokens")
    for k in range(count):
        name = long_enough[k % len(long_enough)]
        ids = reader.ids(name)
        start = rng.randrange(0, len(ids) - length)
        yield name, start, ids[start:start + length]


def code_prompts(files, reader, cfg) -> list[Prompt]:
    rng = random.Random(f"code-{cfg.seed}")
    return [Prompt("code", k, ids, {"file": name, "start_token": start})
            for k, (name, start, ids) in enumerate(_windows(files, reader, cfg.tokens, cfg.num, rng))]


def noise_prompts(files, reader, cfg) -> list[Prompt]:
    """Held-out code windows with their tokens in a seeded random order: the same tokens as code
    prompts, none of the structure (no n-gram to look up, nothing a drafter can follow)."""
    rng = random.Random(f"noise-{cfg.seed}")
    prompts = []
    for k, (name, start, ids) in enumerate(_windows(files, reader, cfg.tokens, cfg.num, rng)):
        ids = list(ids)
        rng.shuffle(ids)
        prompts.append(Prompt("noise", k, ids, {"file": name, "start_token": start, "kind": "shuffled"}))
    return prompts


def _rename_target(text: str) -> str | None:
    """The most frequent identifier of 4+ characters that is not a keyword-ish word."""
    words = Counter(w for w in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b", text)
                    if w not in {"self", "return", "import", "from", "None", "True", "False", "else", "elif",
                                 "while", "with", "pass", "raise", "class", "lambda", "yield", "def", "except"})
    return words.most_common(1)[0][0] if words else None


def grounded_prompts(files, reader, tokenizer, cfg) -> list[Prompt]:
    """A snippet (2/3 of the prompt), a line that asks for it again, then the start of the copy;
    odd prompts ask for the copy with one identifier renamed. The continuation is the rest of
    the copy, which the prompt already holds."""
    rng = random.Random(f"grounded-{cfg.seed}")
    snippet_len = max(1, (2 * cfg.tokens) // 3)
    prompts = []
    for k, (name, start, snippet_ids) in enumerate(_windows(files, reader, snippet_len, cfg.num, rng)):
        snippet = tokenizer.decode(snippet_ids)
        old = _rename_target(snippet) if k % 2 else None
        if old:
            new = old + "_v2"
            copy = re.sub(rf"\b{re.escape(old)}\b", new, snippet)
            header = f"\n\n# The same code again, with `{old}` renamed to `{new}`:\n"
        else:
            copy = snippet
            header = "\n\n# The same code again:\n"
        head_ids = tokenizer(header, add_special_tokens=False)["input_ids"]
        copy_ids = tokenizer(copy, add_special_tokens=False)["input_ids"]
        room = max(0, cfg.tokens - len(snippet_ids) - len(head_ids))
        ids = (list(snippet_ids) + head_ids + copy_ids[:room])[: cfg.tokens]
        prompts.append(Prompt("grounded", k, ids, {"file": name, "start_token": start,
                                                   "kind": "rename" if old else "repeat",
                                                   "renamed": old}))
    return prompts


def _edit_one_line(text: str) -> tuple[str, int] | None:
    """The text with its middle code line edited as a user editing a file would (its first
    identifier of 3+ characters renamed in that line only, else a comment appended), and the line's
    number; None when there is no non-blank line. Only whole lines in the middle qualify: the first
    and last lines of a window are cut mid-line."""
    lines = text.split("\n")
    candidates = [i for i in range(1, len(lines) - 1) if lines[i].strip()]
    if not candidates:
        return None
    at = candidates[len(candidates) // 2]
    line = lines[at]
    found = re.search(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b", line)
    lines[at] = (line[:found.end()] + "_new" + line[found.end():]) if found else line + "  # edited"
    return "\n".join(lines), at


def samples_prompts(files, reader, tokenizer, cfg) -> list[Prompt]:
    """Held-out code windows (their own seeded draw, not the code set's), each with an edited copy
    (Prompt.edited): one line changed in the middle of the window."""
    rng = random.Random(f"samples-{cfg.seed}")
    prompts = []
    for k, (name, start, ids) in enumerate(_windows(files, reader, cfg.tokens, cfg.num, rng)):
        edit = _edit_one_line(tokenizer.decode(ids))
        edited = list(tokenizer(edit[0], add_special_tokens=False)["input_ids"]) if edit else list(ids)
        prompts.append(Prompt("samples", k, list(ids), {"file": name, "start_token": start, "kind": "samples",
                                                        "edited_line": edit[1] if edit else None},
                              edited=edited))
    return prompts


def jsonl_prompts(path: str, tokenizer, cfg, max_prompt_tokens: int) -> list[Prompt]:
    if not os.path.isfile(path):
        raise ConfigError(f"prompts.jsonl={path!r} does not exist")
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["prompt"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InputError(f"{path}:{line_no}: each line must be a JSON object with a \"prompt\" "
                                 f"string ({exc})") from exc
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if not ids:
                raise InputError(f"{path}:{line_no}: the prompt is empty")
            source = {"file": path, "line": line_no}
            if len(ids) > max_prompt_tokens:   # keep the end: it is what the model continues
                source["truncated_from"] = len(ids)
                ids = ids[-max_prompt_tokens:]
            prompts.append(Prompt("jsonl", len(prompts), ids, source))
            if len(prompts) == cfg.num:
                break
    if not prompts:
        raise InputError(f"prompts.jsonl={path!r} holds no prompts")
    return prompts


def build_prompt_sets(cfg, tokenizer, max_prompt_tokens: int) -> dict[str, list[Prompt]]:
    """{set name: prompts} for every set in cfg.sets (cfg: PromptsConfig)."""
    if cfg.tokens > max_prompt_tokens and set(cfg.sets) & {"code", "grounded", "noise", "samples"}:
        raise ConfigError(f"prompts.tokens={cfg.tokens} + max_new_tokens exceeds the target's context: "
                          f"use prompts.tokens <= {max_prompt_tokens}")
    source_dir = cfg.source_dir or stdlib_dir()
    sets: dict[str, list[Prompt]] = {}
    files, reader = None, None
    for name in cfg.sets:
        if name in ("code", "grounded", "noise", "samples") and files is None:
            files = heldout_files(source_dir, cfg.split, cfg.heldout_fraction, cfg.seed)
            reader = _TokenizedFiles(source_dir, tokenizer)
        if name == "code":
            sets[name] = code_prompts(files, reader, cfg)
        elif name == "grounded":
            sets[name] = grounded_prompts(files, reader, tokenizer, cfg)
        elif name == "noise":
            sets[name] = noise_prompts(files, reader, cfg)
        elif name == "samples":
            sets[name] = samples_prompts(files, reader, tokenizer, cfg)
        else:
            sets[name] = jsonl_prompts(cfg.jsonl, tokenizer, cfg, max_prompt_tokens)
    return sets
