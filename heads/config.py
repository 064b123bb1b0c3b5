"""The training configs of `specdec train-heads` (OmegaConf structured configs): Medusa heads
(TrainHeadsConfig), and an EAGLE drafter (TrainEagleConfig, a config with `drafter: eagle`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import OmegaConf

from specdec.config import build_config, find_config_file
from specdec.errors import ConfigError


@dataclass
class TrainHeadsConfig:
    target: Optional[str] = None        # Hugging Face checkpoint folder of the (frozen) target
    tokenizer: Optional[str] = None     # tokenizer folder when it is not beside the target's weights
    output_dir: str = "heads-out"       # final heads + checkpoint.safetensors + train.json; re-run to resume
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
    batch_size: int = 8                 # global batch (split across torchrun ranks)
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
        raise ConfigError("no target given: set target=/path/to/a/huggingface/checkpoint (e.g. `specdec train "
                          "medusa train_heads target=...`); the command, given none, trains for the default family")
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


@dataclass
class TrainEagleConfig:
    drafter: str = "eagle"              # marks a config as an EAGLE training config (`specdec train-heads` dispatch)
    target: Optional[str] = None        # Hugging Face checkpoint folder of the (frozen) target
    tokenizer: Optional[str] = None
    output_dir: str = "eagle-out"       # eagle.json + eagle.safetensors + checkpoint + log; re-run to resume
    corpus: List[str] = field(default_factory=list)     # [] = the whole standard library
    corpus_root: Optional[str] = None
    heldout: List[str] = field(default_factory=list)
    split_file: Optional[str] = None    # JSON with "train" / "heldout" file lists
    # drafter
    layout: str = "eagle3"              # eagle1 (last hidden state, the target's lm_head) | eagle3 (the standard
    #   EAGLE-3 drafter: low, middle and high layer fused, its own lm_head over draft_vocab_size tokens) | mtp
    #   (one MTP module in DeepSeek-V3's layout, cross-entropy only: `specdec train mtp`)
    feature_layers: Optional[List[int]] = None   # override the layers read (hidden_states indices)
    draft_vocab_size: Optional[int] = None   # eagle3: the drafter's vocabulary, the corpus's most frequent
    #   target tokens (None = the whole target vocabulary)
    norm_before_residual: bool = False  # eagle3: the layer's residual is hidden_norm(g) (speculators' flag)
    norm_before_fc: bool = False        # eagle3 (EAGLE 3.1): one RMSNorm over the fused features before fc
    norm_output: bool = False           # eagle3 (EAGLE 3.1): feed norm(x) back between draft steps instead of x
    intermediate_size: Optional[int] = None   # the drafter's SwiGLU width (None = the target's); narrower
    #   drafts faster where one target layer is a large share of the model (small targets, CPUs)
    # objective
    ttt_steps: int = 3                  # unrolled steps on the drafter's own predictions (training-time test)
    step_loss_decay: float = 0.8        # step j's loss weight = decay ** (j - 1)
    feature_loss_weight: float = 0.1    # eagle1 only: smooth-L1 regression of the output onto f_{t+1}
    # optimisation
    seq_len: int = 256
    batch_size: int = 8                 # global batch (split across torchrun ranks)
    steps: int = 300
    max_minutes: Optional[float] = None   # also stop after this much training time (summed over resumes); the
    #   lr schedule then follows whichever of steps / time is further along
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16: Optional[bool] = False        # bf16 autocast for the target and drafter forwards (null: where it pays -
    #   CUDA with bf16, a CPU with bf16 dot products; elsewhere emulated bf16 is many times slower)
    # bookkeeping
    seed: int = 0
    eval_interval: int = 100
    eval_windows: int = 12              # held-out windows of seq_len tokens
    eval_new_tokens: int = 64           # tail of each window replaced by the target's greedy continuation
    eval_depth: int = 6                 # chain depths reported
    checkpoint_interval: int = 50
    device: str = "cpu"
    dtype: str = "float32"              # the target's dtype while training (the drafter trains in fp32)
    backend: Optional[str] = None       # torch.distributed backend under torchrun (None: nccl on CUDA, else gloo)
    progress: bool = True


def is_eagle_config(name_or_path: str) -> bool:
    """Whether a shipped config name / YAML path is an EAGLE training config (`drafter: eagle`)."""
    try:
        data = OmegaConf.load(find_config_file(name_or_path))
    except Exception:  # noqa: BLE001 - let the regular loader report it
        return False
    return OmegaConf.is_dict(data) and data.get("drafter") == "eagle"
