"""Structured configs (OmegaConf over dataclasses): a YAML per ready-made setup in configs/,
dotted `key=value` overrides; unknown keys and bad values are errors that name what is valid."""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError


@dataclass
class TargetConfig:
    path: Optional[str] = None          # Hugging Face checkpoint folder; None = the embedded default model
    tokenizer: Optional[str] = None     # tokenizer folder when it is not beside the weights


@dataclass
class DraftConfig:
    path: Optional[str] = None          # checkpoint folder of the draft (same tokenizer as the target)
    num_tokens: int = 4                 # gamma: chain length (start value when adaptive)
    branching: Optional[List[int]] = None   # tree: children per node at each depth, e.g. [3, 2, 1, 1]
    max_nodes: int = 64                 # tree node budget
    adaptive: bool = False              # adapt gamma to the acceptance history (chains)
    min_tokens: int = 1
    max_tokens: int = 12
    draft_cost: float = 0.1             # draft forward time / target forward time, for adaptive gamma
    min_confidence: float = 0.0         # chains stop early where the draft's own token prob < this (0 = off)


@dataclass
class PromptLookupConfig:
    # Defaults chosen on CPU (benchmarks/pld_check.py): each tree node costs forward time there,
    # so unigram matches (weak guesses) are off and the trie is small. min_ngram=1, max_nodes=40
    # accepts more per forward (3.5 vs 2.9 tokens on pycode), worth it where nodes are cheap.
    min_ngram: int = 2                  # shortest suffix n-gram to look up
    max_ngram: int = 3                  # longest suffix n-gram to look up (tried first)
    num_tokens: int = 10                # tokens taken after each match
    max_matches: int = 4                # distinct continuations merged into the trie (most recent first)
    max_nodes: int = 16                 # trie node budget


@dataclass
class MedusaConfig:
    tree: str = "dynamic"               # "dynamic" (best nodes by cumulative head probability) or "static"
    choices: Optional[List[List[int]]] = None   # static tree: paths of per-head ranks, e.g. [[0], [0, 0], [1]]
    max_nodes: int = 8                  # dynamic tree node budget (CPU-measured; see configs/medusa.yaml)
    top_k: int = 4                      # candidates considered per head (dynamic tree)


@dataclass
class EagleConfig:
    path: Optional[str] = None          # folder written by `specdec train-heads train_eagle` (eagle.json + weights)
    max_nodes: int = 16                 # tree node budget (CPU-measured; see configs/eagle.yaml)
    top_k: int = 4                      # children considered per node (greedy), tree width per depth (sampling)
    depth: int = 6                      # tree levels at most
    expand: Optional[int] = None        # greedy: nodes expanded per depth (None = top_k, EAGLE-2; >= max_nodes = exact best tree)


@dataclass
class HeadsConfig:
    path: Optional[str] = None          # folder written by `specdec train-heads`


@dataclass
class GenerationDefaults:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = 0
    stop: List[str] = field(default_factory=list)


@dataclass
class SpecConfig:
    strategy: str = "autoregressive"
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    dtype: str = "auto"                 # auto | float32 | float16 | bfloat16
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    prompt_lookup: PromptLookupConfig = field(default_factory=PromptLookupConfig)
    medusa: MedusaConfig = field(default_factory=MedusaConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    eagle: EagleConfig = field(default_factory=EagleConfig)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)


# ---------------------------------------------------------------------- loading
def shipped_config_names(subdir: str = "") -> list[str]:
    root = resources.files("specdec.configs")
    if subdir:
        root = root / subdir
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def find_config_file(name_or_path: str, subdir: str = "") -> str:
    """A YAML path, or the name of a config shipped in configs/ (package data)."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if not os.path.isfile(name_or_path):
            raise ConfigError(f"config file {name_or_path!r} not found")
        return name_or_path
    names = shipped_config_names(subdir)
    if name_or_path not in names:
        hint = difflib.get_close_matches(name_or_path, names, n=1)
        raise ConfigError(f"unknown config {name_or_path!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; shipped configs: {', '.join(names)}; or give a path to a YAML file")
    root = resources.files("specdec.configs")
    if subdir:
        root = root / subdir
    return str(root / f"{name_or_path}.yaml")


def _check_keys(node: Any, schema: Any, where: str) -> None:
    """Every key in `node` must exist in `schema`; say which keys are valid when one does not."""
    if not isinstance(node, DictConfig) or not isinstance(schema, DictConfig):
        return
    valid = [str(k) for k in schema.keys()]
    for key in node.keys():
        key = str(key)
        full = f"{where}.{key}" if where else key
        if key not in valid:
            hint = difflib.get_close_matches(key, valid, n=1)
            raise ConfigError(f"unknown config key {full!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                              + f"; valid keys{' under ' + repr(where) if where else ''}: {', '.join(valid)}")
        sub_schema = schema._get_node(key)
        if isinstance(sub_schema, DictConfig) and not sub_schema._is_none():
            _check_keys(node[key], sub_schema, full)


def overrides_to_config(overrides: dict[str, Any] | list[str]) -> DictConfig:
    """{"draft.num_tokens": 6} or ["draft.num_tokens=6"] -> a nested DictConfig."""
    if isinstance(overrides, dict):
        cfg = OmegaConf.create()
        for key, value in overrides.items():
            if isinstance(value, (list, tuple, dict)):
                value = OmegaConf.create(value)
            OmegaConf.update(cfg, key, value, force_add=True)
        return cfg
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. draft.num_tokens=6)")
    return OmegaConf.from_dotlist(list(overrides))


def build_config(schema_cls, name_or_path: str | None, overrides: dict | list | None = None, subdir: str = ""):
    """Schema defaults <- YAML file <- overrides, checked; returns a typed DictConfig."""
    schema = OmegaConf.structured(schema_cls)
    layers = []
    if name_or_path is not None:
        path = find_config_file(name_or_path, subdir)
        try:
            layers.append((f"config file {path}", OmegaConf.load(path)))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from exc
        except Exception as exc:  # yaml errors
            raise ConfigError(f"config file {path!r} could not be read: {exc}") from exc
    if overrides:
        layers.append(("overrides", overrides_to_config(overrides)))
    cfg = schema
    for origin, layer in layers:
        _check_keys(layer, schema, "")
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None)
            raise ConfigError(f"bad value in {origin}" + (f" for {key!r}" if key else "") + f": {exc.msg if hasattr(exc, 'msg') else exc}") from exc
    return cfg


DEVICES_HINT = "auto, cpu, cuda, cuda:N"


def validate_spec_config(cfg: SpecConfig) -> None:
    from .strategies import REGISTRY      # the one list of strategies
    STRATEGIES = tuple(REGISTRY)
    if cfg.strategy not in STRATEGIES:
        hint = difflib.get_close_matches(cfg.strategy, STRATEGIES, n=1)
        raise ConfigError(f"unknown strategy {cfg.strategy!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; valid strategies: {', '.join(STRATEGIES)}")
    if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
        raise ConfigError(f"device={cfg.device!r} is not valid; use one of: {DEVICES_HINT}")
    if cfg.dtype not in ("auto", "float32", "float16", "bfloat16"):
        raise ConfigError(f"dtype={cfg.dtype!r} is not valid; use one of: auto, float32, float16, bfloat16")
    if cfg.draft.num_tokens < 1:
        raise ConfigError(f"draft.num_tokens must be >= 1, got {cfg.draft.num_tokens}")
    if cfg.draft.max_nodes < 1:
        raise ConfigError(f"draft.max_nodes must be >= 1, got {cfg.draft.max_nodes}")
    for key in ("max_nodes", "top_k", "depth", "expand"):
        if getattr(cfg.eagle, key) is not None and getattr(cfg.eagle, key) < 1:
            raise ConfigError(f"eagle.{key} must be >= 1, got {getattr(cfg.eagle, key)}")
    g = cfg.generation
    if g.max_new_tokens < 1:
        raise ConfigError(f"generation.max_new_tokens must be >= 1, got {g.max_new_tokens}")
    if g.temperature < 0:
        raise ConfigError(f"generation.temperature must be >= 0 (0 = greedy), got {g.temperature}")
    if not 0 < g.top_p <= 1:
        raise ConfigError(f"generation.top_p must be in (0, 1], got {g.top_p}")
    if g.top_k < 0:
        raise ConfigError(f"generation.top_k must be >= 0 (0 = off), got {g.top_k}")


def load_spec_config(name_or_path: str | None = "autoregressive", overrides: dict | list | None = None) -> SpecConfig:
    cfg = build_config(SpecConfig, name_or_path, overrides)
    validate_spec_config(cfg)
    return cfg
