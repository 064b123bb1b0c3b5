"""specdec.load(config, **overrides): a Speculator built from a config - a shipped config name or a
YAML path, with dotted overrides - and the models it names; with no target.path, the embedded
default model family (specdec.family, built on first use)."""
from __future__ import annotations

from .api import Speculator
from .config import load_spec_config
from .models import load_model, load_tokenizer, resolve_device, resolve_dtype
from .strategies import build_strategy


def load(config: str = "autoregressive", /, **overrides) -> Speculator:
    """Build a Speculator from a shipped config name or a YAML path, with dotted overrides:
    specdec.load("draft_model", **{"target.path": "...", "draft.path": "..."})."""
    cfg = load_spec_config(config, overrides)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.target.path is None:
        # imported when used: the family's builder brings the trainers with it (import time, not a circle)
        from .family.defaults import apply_default_paths
        apply_default_paths(cfg)
    target = load_model(cfg.target.path, "target", device, dtype)
    tokenizer = load_tokenizer(cfg.target.tokenizer or cfg.target.path, "target")
    strategy = build_strategy(cfg, target, tokenizer, device, dtype)
    return Speculator(target, tokenizer, strategy, config=cfg)
