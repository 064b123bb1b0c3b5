"""What the default model family is made of: corpus, tokenizer, model sizes and training
budgets, as a structured config (defaults in configs/default_family.yaml). Its hash names
the cache folder, so changing any size or budget builds a new family beside the old one."""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import OmegaConf

from specdec.config import build_config
from specdec.errors import ConfigError
from specdec.heads.config import TrainEagleConfig, TrainHeadsConfig
from specdec.heads.distill import TrainDraftConfig, validate as validate_train_draft

# Bump when the builder's output changes for the same config (invalidates every cache).
# 2: the draft is distilled by `specdec train-draft`'s code (train_draft), not by lm.train_lm.
# 3: the target is pretrained in the one training loop (heads/loop.py), not by lm.train_lm.
BUILDER_VERSION = 3


@dataclass
class CorpusConfig:
    root: Optional[str] = None          # folder of .py files; None = this Python's standard library
    heldout_fraction: float = 0.05      # files kept out of training (seeded split)
    max_files: int = 0                  # 0 = every file; tests use a handful
    min_file_chars: int = 200           # skip near-empty files (bare __init__.py)
    tokenizer_chars: int = 3_000_000    # characters of training text the BPE trainer reads
    train_chars: int = 4_000_000        # characters of training text tokenized for the LMs


@dataclass
class TokenizerConfig:
    vocab_size: int = 2048              # byte-level BPE; <|endoftext|> is EOS, BOS and pad
    min_frequency: int = 2


@dataclass
class LMTrainConfig:
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3                    # peak; cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_windows: int = 8               # held-out windows for the loss written to train.json
    checkpoint_interval: int = 100      # steps between the checkpoints an interrupted build goes on from


@dataclass
class LMConfig:
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 688
    max_position_embeddings: int = 1024
    train: LMTrainConfig = field(default_factory=LMTrainConfig)


@dataclass
class DraftBuildConfig:
    # the `specdec train-draft` config; target, output_dir and the corpus split are filled in. draft stays
    # null: a fresh draft of the target's architecture, sized by draft_config (no other model has the
    # family's tokenizer)
    train: TrainDraftConfig = field(default_factory=TrainDraftConfig)


@dataclass
class HeadsBuildConfig:
    enabled: bool = True                # False: no Medusa heads (the demo skips the medusa row)
    # the `specdec train-heads` config; target, output_dir and the corpus split are filled in
    train: TrainHeadsConfig = field(default_factory=TrainHeadsConfig)


@dataclass
class EagleBuildConfig:
    enabled: bool = True                # False: no EAGLE drafter (the demo skips the eagle row)
    # the `specdec train-heads train_eagle` config; target, output_dir and the corpus split are filled in
    train: TrainEagleConfig = field(default_factory=TrainEagleConfig)


@dataclass
class FamilyConfig:
    seed: int = 0
    threads: int = 1                    # torch threads while building; a fixed number keeps the result
    #                                     bit-identical across machines (0 = torch's default)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    target: LMConfig = field(default_factory=LMConfig)
    draft: DraftBuildConfig = field(default_factory=DraftBuildConfig)
    heads: HeadsBuildConfig = field(default_factory=HeadsBuildConfig)
    eagle: EagleBuildConfig = field(default_factory=EagleBuildConfig)


DEFAULT_FAMILY_CONFIG = "default_family"


def load_family_config(name_or_path: str | None = DEFAULT_FAMILY_CONFIG,
                       overrides: dict | list | None = None) -> FamilyConfig:
    """Schema defaults <- configs/default_family.yaml (or a YAML path) <- dotted overrides."""
    cfg = build_config(FamilyConfig, name_or_path, overrides)
    _validate(cfg)
    return cfg


def _validate(cfg: FamilyConfig) -> None:
    if cfg.threads < 0:
        raise ConfigError(f"threads must be >= 0 (0 = torch's default), got {cfg.threads}")
    if not 0 < cfg.corpus.heldout_fraction < 1:
        raise ConfigError(f"corpus.heldout_fraction must be in (0, 1), got {cfg.corpus.heldout_fraction}")
    if cfg.tokenizer.vocab_size < 257:
        raise ConfigError(f"tokenizer.vocab_size must be > 256 (the byte alphabet + <|endoftext|>), "
                          f"got {cfg.tokenizer.vocab_size}")
    target, draft = cfg.target, cfg.draft.train
    for name, shape in (("target", target), ("draft.train.draft_config", draft.draft_config)):
        if shape.hidden_size % shape.num_heads:     # checked here, before minutes of building the earlier parts
            raise ConfigError(f"{name}.hidden_size ({shape.hidden_size}) must be a multiple of "
                              f"{name}.num_heads ({shape.num_heads})")
    if target.train.seq_len + 1 > target.max_position_embeddings:
        raise ConfigError(f"target.train.seq_len ({target.train.seq_len}) must be below "
                          f"target.max_position_embeddings ({target.max_position_embeddings})")
    if min(target.train.steps, target.train.batch_size, target.train.checkpoint_interval) < 1:
        raise ConfigError("target.train.steps, target.train.batch_size and target.train.checkpoint_interval "
                          "must be >= 1")
    if draft.draft is not None:
        raise ConfigError(f"draft.train.draft must be null (the family distils a fresh draft, sized by "
                          f"draft.train.draft_config), got {draft.draft!r}")
    if draft.seq_len > target.max_position_embeddings:     # the fresh draft takes the target's positions
        raise ConfigError(f"draft.train.seq_len ({draft.seq_len}) must be at most "
                          f"target.max_position_embeddings ({target.max_position_embeddings})")
    validate_train_draft(OmegaConf.merge(draft, {"target": "the family's target"}))   # loss, jsd_beta, prompt_tokens


def config_digest(data) -> str:
    text = OmegaConf.to_yaml(data, sort_keys=True)
    text += f"\nbuilder={BUILDER_VERSION}\npython={sys.version_info.major}.{sys.version_info.minor}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def config_hash(cfg: FamilyConfig) -> str:
    """12 hex digits naming this exact family: config, builder version and Python version
    (the corpus is that Python's standard library)."""
    return config_digest(cfg)


# The config sections each part's files depend on (besides seed, threads, corpus and tokenizer):
# the draft is distilled from the target, the heads and the EAGLE drafter are trained on it.
PART_SECTIONS = {"tokenizer": (), "target": ("target",), "draft": ("target", "draft"),
                 "heads": ("target", "heads"), "eagle": ("target", "eagle")}


def part_hash(cfg: FamilyConfig, part: str) -> str:
    """12 hex digits naming what one part is built from: two families whose configs differ only
    elsewhere build this part identically, so one can take it from the other."""
    sections = ("seed", "threads", "corpus", "tokenizer") + PART_SECTIONS[part]
    whole = OmegaConf.to_container(cfg)
    return config_digest(OmegaConf.create({name: whole[name] for name in sections}))
