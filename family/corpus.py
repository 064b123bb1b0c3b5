"""The training text: Python source files (by default the standard library of the running
Python), in a deterministic order, split into train and held-out files by a seeded shuffle."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass

from specdec.errors import ConfigError

SKIPPED_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


def stdlib_root() -> str:
    return os.path.dirname(os.__file__)


def list_python_files(root: str, min_chars: int = 0) -> list[str]:
    """Paths of the .py files under root (relative, '/'-separated, sorted), test folders and
    files under min_chars bytes skipped."""
    if not os.path.isdir(root):
        raise ConfigError(f"corpus.root {root!r} is not a folder: give a folder of .py files "
                          f"(or leave it unset for the Python standard library)")
    found = []
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        for name in files:
            if name.endswith(".py") and os.path.getsize(os.path.join(folder, name)) >= min_chars:
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


@dataclass
class CorpusSplit:
    root: str
    train: list[str]      # relative paths, in the seeded order training reads them
    heldout: list[str]

    def read(self, relpath: str) -> str:
        with open(os.path.join(self.root, relpath), encoding="utf-8", errors="replace") as f:
            return f.read()

    def texts(self, which: str, max_chars: int) -> list[str]:
        """Whole files of one side of the split, in order, until max_chars (at least one file)."""
        texts, total = [], 0
        for relpath in getattr(self, which):
            if texts and total >= max_chars:
                break
            text = self.read(relpath)
            texts.append(text)
            total += len(text)
        return texts


def split_corpus(root: str | None, heldout_fraction: float, seed: int, max_files: int = 0,
                 min_chars: int = 0) -> CorpusSplit:
    root = root or stdlib_root()
    files = list_python_files(root, min_chars)
    random.Random(seed).shuffle(files)
    if max_files:
        files = files[:max_files]
    if len(files) < 2:
        raise ConfigError(f"the corpus under {root!r} has {len(files)} .py file(s); need at least 2 "
                          f"(one to train on, one held out)")
    n_heldout = min(len(files) - 1, max(1, round(len(files) * heldout_fraction)))
    return CorpusSplit(root=root, train=files[n_heldout:], heldout=files[:n_heldout])
