"""Structured configs (OmegaConf over dataclasses): a YAML per ready-made setup in configs/,
dotted `key=value` overrides; unknown keys and bad values are errors that name what is valid."""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, List, Optional, Sequence

import yaml

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .arguments import check_generation_args
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
    max_nodes: int = 11                 # tree node budget (CPU-measured: 8-11 nodes verify at one cost; configs/eagle.yaml)
    top_k: int = 4                      # children considered per node (greedy and the coupled sampler)
    depth: int = 8                      # tree levels at most (configs/eagle.yaml)
    expand: Optional[int] = None        # greedy: nodes expanded per depth (None = top_k, EAGLE-2; >= max_nodes = exact best tree)
    stop_below: float = 0.2             # greedy: stop expanding once the nodes to expand hold less path probability
    #                                     in all than this (0 = always `depth` levels)
    sampled_top_k: Optional[int] = 1    # sampling (rejection): nodes per level (1 = a chain; null = top_k)
    sampled_depth: Optional[int] = 4    # sampling (rejection): levels (null = depth); every sampled node is verified
    score_temperature: float = 0.5      # greedy: the tree is ranked by the drafter's probabilities at this temperature
    #                                     (< 1 sharpens; 1 = as drafted; strategies/eagle.py)
    dtype: Optional[str] = "auto"       # the drafter's dtype: null = the target's; auto = bfloat16 beside a float32 target on
    #                                     CUDA, or on a CPU where a drafter forward is measured faster in it; or a name


@dataclass
class HeadsConfig:
    path: Optional[str] = None          # folder written by `specdec train-heads`


@dataclass
class AutoConfig:
    # `auto` (strategies/auto.py): prompt lookup plus the neural drafter whose path is given
    # (eagle.path, heads.path or draft.path, in that order of preference), one merged tree per step,
    # sized by the planner from the verify costs measured on this machine (specdec/costmodel.py).
    max_nodes: int = 32                 # the planner's ceiling on tree nodes per step
    drafter: Optional[str] = None       # null = the first of eagle / medusa / draft_model with a path; "none" = lookup only
    lookup: bool = True                 # false: the drafter alone, its trees sized by the planner (max_nodes: auto
    #                                     for that strategy), e.g. auto heads.path=H auto.lookup=false
    profile: bool = True                # measure (or read the cached) verify costs at load; False = a linear guess
    profile_context: int = 128          # context length of the measurement
    profile_repeats: int = 5            # rounds over every tree size; the median of each size is kept
    explore_every: int = 8              # look at a drafter that has not paid lately after this many steps (the gap
    #                                     doubles while it keeps not paying, up to 64); 1 = call it every step
    calibration_prior: float = 4.0      # pseudo-observations pulling a calibration bucket towards its raw confidence
    sampled_confidence: bool = False    # true: sampled drafter nodes estimated per draft-probability bucket; false: per
    #                                     depth (an optimistic prior the first calls correct; won 5 of 6 T=0.8 cells)
    observed_rates: bool = False        # true: call the drafter on the tokens/s observed with / without it (per
    #                                     lookup context) once both are known; false: on the planner's rates. Off:
    #                                     in an A/B (pycode, 3 sets x 2 temperatures) it won 4 of 12 cells, lost 8


@dataclass
class GenerationDefaults:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = 0
    stop: List[str] = field(default_factory=list)
    sampler: str = "rejection"          # temperature > 0: "rejection" (lossless rejection sampling) or
    #                                     "coupled" (Gumbel-max keyed by (seed, position): same text for every strategy)


@dataclass
class SpecConfig:
    strategy: str = "autoregressive"
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    dtype: str = "auto"                 # auto | float32 | float16 | bfloat16
    compile: bool = False               # verify forward compiled with static shapes (README: compile)
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    prompt_lookup: PromptLookupConfig = field(default_factory=PromptLookupConfig)
    medusa: MedusaConfig = field(default_factory=MedusaConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    eagle: EagleConfig = field(default_factory=EagleConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    profile: bool = False               # exact draft / verify time split on a GPU (a synchronisation around
    #                                     each; off: no synchronisation in the loop, see README "Host reads")


# ---------------------------------------------------------------------- loading
def _config_root(subdir: str = ""):
    root = resources.files("specdec.configs")
    return root / subdir if subdir else root


def _top_level_keys(path) -> set[str] | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return {str(k) for k in data} if isinstance(data, dict) else set() if data is None else None


def is_config_of(keys: set[str] | None, schema_cls) -> bool:
    """Whether a YAML with these top-level keys is a config of `schema_cls`. A generation config
    (SpecConfig) names its `strategy:`; any other kind (training, the default family, bench
    presets) has no `strategy:` key and only keys that are fields of its schema."""
    if keys is None:
        return False
    fields = {f.name for f in dataclasses.fields(schema_cls)}
    if "strategy" in fields:
        return "strategy" in keys
    return "strategy" not in keys and keys <= fields


def shipped_config_names(subdir: str = "", schema_cls=None) -> list[str]:
    """Names of the YAMLs shipped in configs/<subdir>; with `schema_cls`, only those of that kind
    (e.g. SpecConfig: the generation configs specdec.load() takes)."""
    names = []
    for path in _config_root(subdir).iterdir():
        if path.name.endswith(".yaml") and (schema_cls is None or is_config_of(_top_level_keys(path), schema_cls)):
            names.append(path.name[:-5])
    return sorted(names)


def _kind(schema_cls) -> str:
    return "generation config" if schema_cls is SpecConfig else f"{schema_cls.__name__} file"


def find_config_file(name_or_path: str, subdir: str = "", schema_cls=None) -> str:
    """A YAML path, or the name of a config shipped in configs/ (package data); with `schema_cls`,
    a shipped name must be a config of that kind."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if not os.path.isfile(name_or_path):
            raise ConfigError(f"config file {name_or_path!r} not found")
        return name_or_path
    names = shipped_config_names(subdir, schema_cls)
    path = _config_root(subdir) / f"{name_or_path}.yaml"
    if name_or_path not in names:
        listing = f"shipped {_kind(schema_cls) + 's' if schema_cls else 'configs'}: {', '.join(names)}"
        if path.is_file():
            what = " (those name a strategy:)" if schema_cls is SpecConfig else ""
            raise ConfigError(f"config {name_or_path!r} is shipped but is not a {_kind(schema_cls)}{what}: it "
                              f"belongs to another command (specdec train-heads, the default family, ...); "
                              f"{listing}; or give a path to a YAML file")
        hint = difflib.get_close_matches(name_or_path, names, n=1)
        raise ConfigError(f"unknown config {name_or_path!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; {listing}; or give a path to a YAML file")
    return str(path)


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


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Command-line `key=value` overrides -> {dotted key: value}, each value parsed as YAML the way
    OmegaConf's dotlist does: draft.branching=[2,2,1], generation.stop=[return], generation.seed=null.
    The one parser of every subcommand (generate, train-heads, bench)."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. draft.num_tokens=6)")
        key = key.strip()
        try:
            node = OmegaConf.from_dotlist([f"{key}={text}"])
        except Exception as exc:  # noqa: BLE001 - yaml parser / omegaconf key errors, re-raised plainly
            reason = str(exc).splitlines()[0]
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({reason}): close its "
                              f"brackets or quotes, or quote the whole value") from exc
        value = OmegaConf.select(node, key)
        parsed[key] = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
    return parsed


def overrides_to_config(overrides: dict[str, Any] | Sequence[str]) -> DictConfig:
    """{"draft.num_tokens": 6} or ["draft.num_tokens=6"] -> a nested DictConfig."""
    if not isinstance(overrides, dict):
        overrides = parse_overrides(overrides)
    cfg = OmegaConf.create()
    for key, value in overrides.items():
        if isinstance(value, (list, tuple, dict)):
            value = OmegaConf.create(value)
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def _describe_type(hint, plural: bool = False) -> str:
    """A dataclass field's type in words: int -> "an integer", Optional[List[int]] -> "a list of
    integers or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return _describe_type(inner[0], plural) + " or null" if len(inner) == 1 else "a value"
    if origin in (list, List, tuple):
        element = _describe_type(args[0], plural=True) if args else "values"
        return f"{'lists' if plural else 'a list'} of {element}"
    if dataclasses.is_dataclass(hint):
        keys = ", ".join(f.name for f in dataclasses.fields(hint))
        return f"{'mappings' if plural else 'a mapping'} with keys {keys}"
    words = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
             str: ("a string", "strings")}
    return words.get(hint, ("a value", "values"))[plural]


def _field_type(schema_cls, key: str):
    """The declared type of a dotted key of the schema (None when it is not a dataclass field)."""
    hint = schema_cls
    for part in key.split("."):
        if not dataclasses.is_dataclass(hint):
            return None
        hints = typing.get_type_hints(hint)
        if part not in hints:
            return None
        hint = hints[part]
        if typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint):
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
                hint = inner[0]
    return hint


def _leaves(node: DictConfig, schema: DictConfig, where: str = ""):
    """(dotted key, value node) of every value in `node`, descending where the schema has a section."""
    for key in node.keys():
        key = str(key)
        full = f"{where}.{key}" if where else key
        sub_schema = schema._get_node(key) if isinstance(schema, DictConfig) else None
        value = node._get_node(key)
        if isinstance(value, DictConfig) and isinstance(sub_schema, DictConfig) and not sub_schema._is_none():
            yield from _leaves(value, sub_schema, full)
        else:
            yield full, value


def _bad_value_error(schema_cls, schema: DictConfig, layer: DictConfig, origin: str, exc: Exception) -> ConfigError:
    """Find the value OmegaConf refused (merging one leaf at a time) and say, in words, what it
    expected: `bad value for 'draft.num_tokens': expected an integer, got 'abc'`."""
    for key, node in _leaves(layer, schema):
        single = OmegaConf.create()
        OmegaConf.update(single, key, node, force_add=True)
        try:
            OmegaConf.merge(schema, single)
        except OmegaConfBaseException:
            value = OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node._value()
            hint = _field_type(schema_cls, key)
            expected = _describe_type(hint) if hint is not None else "another value"
            where = "" if origin == "overrides" else f" (in {origin})"
            return ConfigError(f"bad value for {key!r}{where}: expected {expected}, got {value!r}")
    message = str(getattr(exc, "msg", exc)).splitlines()[0]
    return ConfigError(f"bad value in {origin}: {message}")


def build_config(schema_cls, name_or_path: str | None, overrides: dict | list | None = None, subdir: str = ""):
    """Schema defaults <- YAML file <- overrides, checked; returns a typed DictConfig."""
    schema = OmegaConf.structured(schema_cls)
    layers = []
    if name_or_path is not None:
        path = find_config_file(name_or_path, subdir, schema_cls)
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
            raise _bad_value_error(schema_cls, schema, layer, origin, exc) from None
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
    if cfg.eagle.dtype not in (None, "auto", "float32", "float16", "bfloat16"):
        raise ConfigError(f"eagle.dtype={cfg.eagle.dtype!r} is not valid; use null (the target's), auto, float32, "
                          f"float16 or bfloat16")
    if cfg.auto.max_nodes < 0:
        raise ConfigError(f"auto.max_nodes must be >= 0, got {cfg.auto.max_nodes}")
    if cfg.auto.drafter not in (None, "none", "draft_model", "medusa", "eagle"):
        raise ConfigError(f"auto.drafter={cfg.auto.drafter!r} is not valid; use null (the first drafter with a path), "
                          f"none, draft_model, medusa or eagle")
    generation = {name: cfg.generation[name] for name in cfg.generation}
    check_generation_args(generation, prefix="generation.", error=ConfigError)


def load_spec_config(name_or_path: str | None = "autoregressive", overrides: dict | list | None = None) -> SpecConfig:
    cfg = build_config(SpecConfig, name_or_path, overrides)
    validate_spec_config(cfg)
    return cfg
