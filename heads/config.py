"""The training config of `specdec train-heads` (OmegaConf structured config)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from specdec.config import build_config
from specdec.errors import ConfigError


@dataclass
class TrainHeadsConfig:
    target: Optional[str] = None        # Hugging Face checkpoint folder of the (frozen) target
    tokenizer: Optional[str] = None     # tokenizer folder when it is not beside the target's weights
    output_dir: str = "heads-out"       # final heads + checkpoint.pt + train.json; re-run to resume
    # corpus: folders / files (relative paths from corpus_root); [] = the whole standard library
    corpus: List[str] = field(default_factory=list)
    corpus_root: Optional[str] = None   # None = the standard library folder
    heldout: List[str] = field(default_factory=list)   # [] = 5% of the corpus files, chosen by hash
    split_file: Optional[str] = None    # JSON with "train" / "heldout" lists (overrides corpus / heldout)
    # heads
    num_heads: int = 4
    num_layers: int = 1
    own_lm_head: bool = False           # False: share the target's frozen lm_head (not saved with heads)
    token_conditioned: bool = True      # head k also sees token t + k, the one before its guess (False: plain Medusa)
    # optimisation
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 300
    lr: float = 1e-3                    # peak; linear warmup, cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    head_loss_decay: float = 0.8        # head k's loss weight = decay ** (k - 1)
    # bookkeeping
    seed: int = 0
    eval_interval: int = 100            # steps between held-out evaluations (also at start and end)
    eval_windows: int = 16              # held-out windows of seq_len tokens
    checkpoint_interval: int = 50       # steps between checkpoints (also at the end)
    device: str = "cpu"                 # cpu | cuda | auto
    dtype: str = "float32"              # the target's dtype while training (heads train in fp32)
    progress: bool = True               # tqdm progress bar


def validate(cfg: TrainHeadsConfig) -> None:
    if not cfg.target:
        raise ConfigError("no target given: set target=/path/to/a/huggingface/checkpoint "
                          "(e.g. `specdec train-heads train_heads target=...`)")
    for name in ("num_heads", "num_layers", "seq_len", "batch_size", "steps", "eval_windows",
                 "eval_interval", "checkpoint_interval"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.seq_len <= cfg.num_heads + 1:
        raise ConfigError(f"seq_len ({cfg.seq_len}) must exceed num_heads + 1 ({cfg.num_heads + 1})")
    if not cfg.lr > 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if not 0 < cfg.head_loss_decay <= 1:
        raise ConfigError(f"head_loss_decay must be in (0, 1], got {cfg.head_loss_decay}")


def load_train_config(name_or_path: str | None = None, overrides: dict | list | None = None) -> TrainHeadsConfig:
    """Schema defaults <- a shipped config name (e.g. "train_heads") or YAML path <- overrides."""
    cfg = build_config(TrainHeadsConfig, name_or_path, overrides)
    validate(cfg)
    return cfg
