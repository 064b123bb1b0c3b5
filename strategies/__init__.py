"""Drafting strategies, one module each, all deriving from strategies.base.BaseStrategy."""
from __future__ import annotations

import importlib

from .base import BaseStrategy, BatchDrafter, LookupPart, Strategy, as_strategy, per_call

# name -> module that defines from_config(cfg, target, tokenizer, device, dtype)
REGISTRY = {
    "autoregressive": "specdec.strategies.autoregressive",
    "draft_model": "specdec.strategies.draft_model",
    "prompt_lookup": "specdec.strategies.prompt_lookup",
    "suffix": "specdec.strategies.suffix",
    "token_recycling": "specdec.strategies.token_recycling",
    "sam": "specdec.strategies.sam",
    "rest": "specdec.strategies.rest",
    "lookahead": "specdec.strategies.lookahead",
    "medusa": "specdec.strategies.medusa",
    "eagle": "specdec.strategies.eagle",
    "early_exit": "specdec.strategies.early_exit",
    "layer_skip": "specdec.strategies.layer_skip",
    "mtp": "specdec.strategies.mtp",
    "auto": "specdec.strategies.auto",
}


def config_sections() -> dict[str, type]:
    """{section name: config dataclass} of every registered strategy (its module's CONFIG_SECTIONS),
    in registry order: what specdec.config.SpecConfig adds to the engine's own settings."""
    sections: dict[str, type] = {}
    for name, module_name in REGISTRY.items():
        for section, cls in getattr(importlib.import_module(module_name), "CONFIG_SECTIONS", {}).items():
            if sections.setdefault(section, cls) is not cls:
                raise RuntimeError(f"config section {section!r} is declared twice (by {name} and another strategy)")
    return sections


def build_strategy(cfg, target, tokenizer, device, dtype) -> BaseStrategy:
    """The strategy named by cfg.strategy, built from its config section."""
    module = importlib.import_module(REGISTRY[cfg.strategy])
    return module.from_config(cfg, target, tokenizer, device, dtype)


__all__ = ["Strategy", "BaseStrategy", "BatchDrafter", "LookupPart", "REGISTRY", "as_strategy", "build_strategy",
           "config_sections", "per_call"]
