"""Build (once) and find the default model family: tokenizer, target, draft, Medusa heads, EAGLE
drafter (the target pretrained in the library's one training loop: family/lm.py; the three drafters
by the library's own train-draft / train-heads code: family/heads.py).
A part that another family in the cache built from the same config sections (config.part_hash) is
copied from there instead of trained again."""
from __future__ import annotations

import glob
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Optional

import torch
from omegaconf import OmegaConf

from specdec.atomic import atomic_write_json, atomic_write_text

from . import store
from .config import FamilyConfig, config_digest, config_hash, part_hash
from .corpus import CorpusSplit, split_corpus
from .heads import train_default_draft, train_default_eagle, train_default_heads

PARTS = ("tokenizer", "target", "draft", "heads", "eagle")
OPTIONAL_PARTS = ("heads", "eagle")     # built when cfg.<part>.enabled
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FamilyPaths:
    folder: str
    tokenizer: str
    target: str
    draft: str
    heads: Optional[str]      # None when the config builds no heads
    eagle: Optional[str] = None   # None when the config builds no EAGLE drafter


def family_paths(cfg: FamilyConfig) -> FamilyPaths:
    folder = store.family_folder(config_hash(cfg))
    optional = {part: os.path.join(folder, part) if cfg[part].enabled else None for part in OPTIONAL_PARTS}
    return FamilyPaths(folder=folder, tokenizer=os.path.join(folder, "tokenizer"),
                       target=os.path.join(folder, "target"), draft=os.path.join(folder, "draft"), **optional)


def family_is_built(cfg: FamilyConfig) -> bool:
    return store.is_complete(family_paths(cfg).folder, config_hash(cfg))


def ensure_family(cfg: FamilyConfig) -> FamilyPaths:
    """The family's paths, building whatever is missing first (a few minutes, once)."""
    paths = family_paths(cfg)
    digest = config_hash(cfg)
    if store.is_complete(paths.folder, digest):
        return paths
    with store.build_lock(paths.folder):
        if not store.is_complete(paths.folder, digest):     # another process may have finished it
            _build(cfg, paths, digest)
    return paths


class _Builder:
    """Builds the parts in order; shares the corpus split between them."""

    def __init__(self, cfg: FamilyConfig, paths: FamilyPaths):
        self.cfg = cfg
        self.paths = paths
        self._split: CorpusSplit | None = None

    @property
    def split(self) -> CorpusSplit:
        if self._split is None:
            c = self.cfg.corpus
            self._split = split_corpus(c.root, c.heldout_fraction, self.cfg.seed, c.max_files, c.min_file_chars)
        return self._split

    # ------------------------------------------------------------------ parts
    def build_tokenizer(self, out: str) -> None:
        from .tokenizer import train_tokenizer
        c = self.cfg
        texts = self.split.texts("train", c.corpus.tokenizer_chars)
        tok = train_tokenizer(texts, c.tokenizer.vocab_size, c.tokenizer.min_frequency,
                              c.target.max_position_embeddings)     # the draft takes the target's positions
        tok.save_pretrained(out)
        atomic_write_json(os.path.join(out, "split.json"), {"root": self.split.root, "train": self.split.train,
                                                             "heldout": self.split.heldout}, indent=1)

    def build_target(self, out: str) -> None:
        from .lm import pretrain_target
        record = pretrain_target(self.cfg, self.paths.tokenizer, self.split,
                                 store.work_folder(self.paths.folder, "target"), out)
        log.info(f"  target: {record['parameters'] / 1e6:.2f}M params, loss {record['first_loss']:.2f} -> "
                 f"{record['last_loss']:.2f}, held-out {record['heldout_loss_at_start']:.2f} -> "
                 f"{record['heldout_loss']:.2f} ({record['minutes']:.1f} min)")

    def build_draft(self, out: str) -> None:
        train_default_draft(self.paths.target, self.split, self.cfg, out)

    def build_heads(self, out: str) -> None:
        train_default_heads(self.paths.target, self.split, self.cfg, out)

    def build_eagle(self, out: str) -> None:
        train_default_eagle(self.paths.target, self.split, self.cfg, out)

    def step(self, part: str):
        """The function that builds `part` into a given folder."""
        return getattr(self, f"build_{part}")


def built_elsewhere(cfg: FamilyConfig, part: str, folder: str) -> Optional[str]:
    """`part` of another complete family in the cache built from the same config sections, or None.
    A family is trusted only when its family.yaml hashes to its COMPLETE marker (same config text,
    builder version and Python) and the part carries that marker too."""
    wanted = part_hash(cfg, part)
    for other in sorted(glob.glob(os.path.join(os.path.dirname(folder), "default-*"))):
        if os.path.abspath(other) == os.path.abspath(folder):
            continue
        try:
            built_from = OmegaConf.load(os.path.join(other, "family.yaml"))
            digest = config_digest(built_from)
            if not (store.is_complete(other, digest) and store.part_is_complete(other, part, digest)):
                continue
            if part_hash(built_from, part) == wanted:
                return os.path.join(other, part)
        except Exception:                      # an unreadable or foreign folder is simply not a donor
            continue
    return None


def _copy_part(source: str):
    def build(out: str) -> None:
        shutil.copytree(source, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(store.PART_COMPLETE))
    return build


def _build(cfg: FamilyConfig, paths: FamilyPaths, digest: str) -> None:
    wanted = [p for p in PARTS if p not in OPTIONAL_PARTS or cfg[p].enabled]
    todo = [p for p in wanted if not store.part_is_complete(paths.folder, p, digest)]
    # finished parts stay, and so do the training runs of the others: an interrupted one goes on from its checkpoint
    store.remove_stale(paths.folder, keep={p for p in wanted if p not in todo} |
                       {os.path.basename(store.work_folder(paths.folder, p)) for p in todo})
    log.info(f"specdec: building the default model family ({', '.join(todo)}) in {paths.folder} - once, "
             f"a few minutes on a CPU")
    builder = _Builder(cfg, paths)
    started = time.perf_counter()
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        for part in todo:
            donor = built_elsewhere(cfg, part, paths.folder)
            log.info(f"{part} ..." + (f" (the same as {donor}: copied)" if donor else ""))
            store.build_part(paths.folder, part, digest, _copy_part(donor) if donor else builder.step(part))
            shutil.rmtree(store.work_folder(paths.folder, part), ignore_errors=True)     # nothing left to resume
    finally:
        torch.set_num_threads(threads_before)
    atomic_write_text(os.path.join(paths.folder, "family.yaml"), OmegaConf.to_yaml(cfg))
    store.mark_complete(paths.folder, digest)
    log.info(f"specdec: default model family ready in {(time.perf_counter() - started) / 60:.1f} min: "
             f"{paths.folder}")
