"""The default target's drafters - its draft model, Medusa heads and EAGLE drafter - trained by the
library's own `specdec train-draft` / `specdec train-heads` code on the same training files the
target read (and evaluated on the held-out ones)."""
from __future__ import annotations

import os

from specdec.atomic import atomic_write_json
from specdec.heads import distill, eagle_train, train

from .config import FamilyConfig
from .corpus import CorpusSplit

SPLIT_FILE = "corpus_split.json"


def _files_within(split: CorpusSplit, which: str, max_chars: int) -> list[str]:
    files, total = [], 0
    for relpath in getattr(split, which):
        if files and total >= max_chars:
            break
        files.append(relpath)
        total += os.path.getsize(os.path.join(split.root, relpath))
    return files


def part_train_config(section, target_path: str, split: CorpusSplit, cfg: FamilyConfig, out: str):
    """The training config of a part trained in the one loop (a drafter, or the target itself:
    family/lm.py): its family section, pointed at the target, the output folder and the target's own
    train / held-out files (written there)."""
    from omegaconf import OmegaConf

    split_file = os.path.join(out, SPLIT_FILE)
    atomic_write_json(split_file, {"train": _files_within(split, "train", cfg.corpus.train_chars),
                                   "heldout": _files_within(split, "heldout", cfg.corpus.train_chars // 10)}, indent=1)
    return OmegaConf.merge(section, {"target": target_path, "tokenizer": None, "output_dir": out,
                                     "split_file": split_file, "corpus_root": split.root})


def train_default_draft(target_path: str, split: CorpusSplit, cfg: FamilyConfig, out: str) -> str:
    return distill.train_draft(part_train_config(cfg.draft.train, target_path, split, cfg, out))


def train_default_heads(target_path: str, split: CorpusSplit, cfg: FamilyConfig, out: str) -> str:
    return train.train_heads(part_train_config(cfg.heads.train, target_path, split, cfg, out))


def train_default_eagle(target_path: str, split: CorpusSplit, cfg: FamilyConfig, out: str) -> str:
    return eagle_train.train_eagle(part_train_config(cfg.eagle.train, target_path, split, cfg, out))
