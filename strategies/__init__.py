"""Drafting strategies, one module each, all following strategies.base.Strategy."""
from __future__ import annotations

import importlib

from .base import Strategy

# name -> module that defines from_config(cfg, target, tokenizer, device, dtype)
REGISTRY = {
    "autoregressive": "specdec.strategies.autoregressive",
    "draft_model": "specdec.strategies.draft_model",
    "prompt_lookup": "specdec.strategies.prompt_lookup",
    "medusa": "specdec.strategies.medusa",
    "eagle": "specdec.strategies.eagle",
    "auto": "specdec.strategies.auto",
}


def build_strategy(cfg, target, tokenizer, device, dtype) -> Strategy:
    """The strategy named by cfg.strategy, built from its config section."""
    module = importlib.import_module(REGISTRY[cfg.strategy])
    return module.from_config(cfg, target, tokenizer, device, dtype)


__all__ = ["Strategy", "REGISTRY", "build_strategy"]
