"""Training text for the drafters: corpus files -> one token stream -> windows of seq_len tokens."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from typing import Sequence

import torch

from specdec.errors import ConfigError

log = logging.getLogger(__name__)
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


def stdlib_folder() -> str:
    """The Python standard library's source folder (every Python has it)."""
    return os.path.dirname(os.__file__)


def resolve_files(paths: Sequence[str], root: str | None = None) -> list[str]:
    """Each entry: a folder (its text files, recursively, sorted), a file, relative to `root`
    when not absolute. An empty list means the whole standard library."""
    root = root or stdlib_folder()
    if not paths:
        paths = [root]
    files: list[str] = []
    for entry in paths:
        path = entry if os.path.isabs(entry) else os.path.join(root, entry)
        if os.path.isdir(path):
            for folder, subfolders, names in os.walk(path):
                subfolders[:] = sorted(d for d in subfolders if d != "__pycache__" and not d.startswith("."))
                files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(TEXT_SUFFIXES)]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ConfigError(f"corpus entry {entry!r} ({path}) is neither a file nor a folder: give corpus= "
                              f"folders or files (relative paths are taken from corpus_root={root!r})")
    if not files:
        raise ConfigError(f"the corpus {list(paths)} holds no text files ({', '.join(TEXT_SUFFIXES)})")
    return files


def split_heldout(files: list[str], fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """Deterministic train / held-out split by a hash of each path (when no held-out list is given).
    A single file is both sides; token_streams then holds out the end of its text."""
    def bucket(path: str) -> float:
        return int(hashlib.sha1(path.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    heldout = [f for f in files if bucket(f) < fraction] or files[-1:]
    train = [f for f in files if f not in set(heldout)] or files
    return train, heldout


def tokenize_files(files: Sequence[str], tokenizer, separator_id: int | None) -> torch.Tensor:
    """[T] long: the files' tokens, one after another, separated by `separator_id` (EOS)."""
    texts = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += encoded
        if separator_id is not None:
            ids.append(separator_id)
    return torch.tensor(ids, dtype=torch.long)


def token_streams(train_files: Sequence[str], heldout_files: Sequence[str], tokenizer, separator_id: int | None,
                  min_tokens: int = 0, fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, str | None]:
    """(training stream [T_train], held-out stream [T_heldout], a note for the user or None).
    When the held-out files are the training files (a one-file corpus), the held-out text is the
    last `fraction` of their tokens (at least min_tokens) and the training text the rest, so that
    evaluation never reads text the drafter trained on; the note says so."""
    train_stream = tokenize_files(train_files, tokenizer, separator_id)                 # [T]
    if set(train_files) != set(heldout_files):
        return train_stream, tokenize_files(heldout_files, tokenizer, separator_id), None
    total = train_stream.numel()
    held = min(total, max(math.ceil(total * fraction), min_tokens))
    names = ", ".join(os.path.basename(f) for f in train_files[:3]) + (", ..." if len(train_files) > 3 else "")
    note = (f"the corpus's held-out text is its training text ({names}): holding out its last {held} of {total} "
            f"tokens for evaluation and training on the rest; give heldout= other files to evaluate on them")
    return train_stream[: total - held], train_stream[total - held:], note


def sample_windows(stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator,
                   reach_end: bool = True) -> torch.Tensor:
    """[batch_size, seq_len] windows starting at random places of the [T] stream; reach_end=False: the
    starts stop one short of the last possible one (the default family's target draws so: family/lm.py)."""
    starts = torch.randint(0, stream.numel() - seq_len + int(reach_end), (batch_size,), generator=generator)   # [B]
    return torch.stack([stream[s: s + seq_len] for s in starts.tolist()])


def fixed_windows(stream: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """[n, seq_len] evenly spaced windows (the same on every run): held-out evaluation."""
    count = max(1, min(count, stream.numel() // seq_len))
    starts = torch.linspace(0, stream.numel() - seq_len, count).long()
    return torch.stack([stream[s: s + seq_len] for s in starts.tolist()])


# ---------------------------------------------------------------------- a config's corpus
def corpus_files(cfg) -> tuple[list[str], list[str]]:
    corpus, heldout = list(cfg.corpus), list(cfg.heldout)
    if cfg.split_file:
        try:
            with open(cfg.split_file) as f:
                split = json.load(f)
            corpus, heldout = list(split["train"]), list(split["heldout"])
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"split_file={cfg.split_file!r} could not be read as JSON with 'train' and "
                              f"'heldout' file lists: {exc}") from exc
    files = resolve_files(corpus, cfg.corpus_root)
    if heldout:
        return files, resolve_files(heldout, cfg.corpus_root)
    return split_heldout(files)


def training_streams(cfg, tokenizer, announce: bool = True):
    """(train files, held-out files, train [T_train], held-out [T_heldout]) of the config's corpus:
    the files and their token streams, documents joined by the tokenizer's EOS. A note on how the
    held-out part was chosen is logged as a warning when `announce` (rank 0 of several); a stream
    shorter than one window is a ConfigError."""
    train_files, heldout_files = corpus_files(cfg)
    train_stream, heldout_stream, note = token_streams(train_files, heldout_files, tokenizer, tokenizer.eos_token_id,
                                                       min_tokens=cfg.seq_len + 1)
    if note and announce:
        log.warning(note)
    for name, stream in (("training", train_stream), ("held-out", heldout_stream)):
        if stream.numel() < cfg.seq_len + 1:
            raise ConfigError(f"the {name} text has {stream.numel()} tokens, fewer than seq_len={cfg.seq_len}: "
                              f"give a larger corpus or a smaller seq_len")
    return train_files, heldout_files, train_stream, heldout_stream
