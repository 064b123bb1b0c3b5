"""Structured configs (OmegaConf over dataclasses): a YAML per ready-made setup in configs/,
dotted `key=value` overrides; unknown keys and bad values are errors that name what is valid."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
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


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            min: float | None = None, above: float | None = None, max: float | None = None,
            choices: Sequence[Any] | None = None, item_min: float | None = None,
            item_choices: Sequence[Any] | None = None):
    """A config field with its valid values, checked at load by `check_values`: `min` / `max`
    inclusive, `above` exclusive, `choices` a closed set, `item_min` and `item_choices` for each entry
    of a list.
    A float field is also refused when NaN or infinite."""
    limits = {name: value for name, value in (("min", min), ("above", above), ("max", max),
                                               ("choices", tuple(choices) if choices is not None else None),
                                               ("item_min", item_min),
                                               ("item_choices", tuple(item_choices) if item_choices is not None else None))
              if value is not None}
    return field(default=default, default_factory=default_factory, metadata={"limits": limits})


@dataclass
class GenerationDefaults:
    """The `generation:` section: defaults of generate()'s arguments (specdec.arguments checks them)."""
    max_new_tokens: int = setting(128, min=1)
    temperature: float = setting(0.0, min=0.0)     # 0 = greedy
    top_k: int = setting(0, min=0)                 # 0 = off
    top_p: float = setting(1.0, above=0.0, max=1.0)   # 1 = off
    seed: Optional[int] = setting(None, min=0)     # None = a fresh random seed per call (out.stats.seed says which)
    stop: List[str] = field(default_factory=list)
    sampler: str = setting("rejection", choices=("rejection", "coupled"))   # temperature > 0: "rejection"
    #                                     (lossless rejection sampling) or "coupled" (Gumbel-max keyed by (seed,
    #                                     position): same text for every strategy)


@dataclass
class EngineConfig:
    """The engine's own settings. A generation config (SpecConfig) is these plus one section per
    strategy config that the strategies declare next to their code (their CONFIG_SECTIONS)."""
    strategy: str = "autoregressive"
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    dtype: str = setting("auto", choices=("auto", "float32", "float16", "bfloat16"))
    compile: bool = False               # verify forward compiled with static shapes (docs/gpu.md)
    cudnn_attention: bool = False       # keep PyTorch's cuDNN attention backend on a CUDA GPU; off by default: it
    #                                     plans anew for every new key length, every decode step
    #                                     (specdec.attention_backend; process-wide)
    prefill_chunk: int = setting(2048, min=1)   # prompt tokens per prefill forward: peak activation memory of a
    #                                     long prompt is bounded by the chunk (greedy output unchanged)
    row_linear: int = setting(8, min=0)   # verify forwards of at most this many rows (pending token + tree
    #                                     nodes, a batch's rows together) run the target's large CPU linear
    #                                     layers (weights past a core's cache; smaller ones keep PyTorch's
    #                                     product) through a twin (specdec.row_linear): up to 8 rows as weight @ input.T,
    #                                     which streams the weights on every core; with packed_linear, every
    #                                     forward, past 2 rows on packed weights; 0: off
    packed_linear: bool = True          # on a CPU with oneDNN, the large linear layers of every target forward
    #                                     (with row_linear > 0) and of EAGLE drafters run oneDNN's kernel on a
    #                                     packed copy of their weights (memory: about as much again as those
    #                                     weights, while a Speculator uses them; made only where it fits in a
    #                                     quarter of the free memory). A weight changed in place through
    #                                     `.data` is not seen: build the Speculator again. Process-wide, set
    #                                     by each Speculator as it is built
    target: TargetConfig = field(default_factory=TargetConfig)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    profile: bool = False               # exact draft / verify time split on a GPU (a synchronisation around
    #                                     each; off: no synchronisation in the loop, see docs/gpu.md)


@functools.cache
def spec_config_class() -> type:
    """SpecConfig: EngineConfig's fields with every strategy's sections (specdec.strategies.
    config_sections) placed after `target`, so `cfg.draft.path` and `draft.path=...` work as one
    schema while each section's dataclass lives beside its strategy."""
    from .strategies import config_sections      # the registry; imported late: strategies import the engine
    engine = [(f.name, f.type, f) for f in dataclasses.fields(EngineConfig)]
    sections = [(name, cls, field(default_factory=cls)) for name, cls in config_sections().items()]
    clashes = sorted({name for name, _, _ in engine} & {name for name, _, _ in sections})
    if clashes:
        raise RuntimeError(f"strategy config sections {clashes} clash with engine settings")
    at = [name for name, _, _ in engine].index("target") + 1
    fields = engine[:at] + sections + engine[at:]
    cls = dataclasses.make_dataclass("SpecConfig", fields)
    cls.__module__ = __name__            # its string annotations resolve in this module
    return cls


def __getattr__(name: str):
    if name == "SpecConfig":      # built on first use: the strategies' sections are collected from the registry
        return spec_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    return "generation config" if schema_cls is spec_config_class() else f"{schema_cls.__name__} file"


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
            what = " (those name a strategy:)" if schema_cls is spec_config_class() else ""
            raise ConfigError(f"config {name_or_path!r} is shipped but is not a {_kind(schema_cls)}{what}: it "
                              f"belongs to another command (specdec train-heads, the default family, ...); "
                              f"{listing}; or give a path to a YAML file")
        hint = difflib.get_close_matches(name_or_path, names, n=1)
        raise ConfigError(f"unknown config {name_or_path!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; {listing}; or give a path to a YAML file")
    return str(path)


def _dotted_keys(schema: DictConfig, where: str = "") -> list[str]:
    """Every settable key of a schema, dotted (draft.num_tokens), sections descended."""
    keys = []
    for key in schema.keys():
        full = f"{where}.{key}" if where else str(key)
        sub_schema = schema._get_node(key)
        if isinstance(sub_schema, DictConfig) and not sub_schema._is_none():
            keys += _dotted_keys(sub_schema, full)
        else:
            keys.append(full)
    return keys


def _nearest_keys(key: str, where: str, valid: list[str], root: DictConfig) -> list[str]:
    """The dotted keys nearest to an unknown `key` under `where`, searched over the whole schema:
    a near name in the same section first (draft.num_node -> draft.num_tokens, draft.max_nodes),
    else a near name in any section (num_tokens -> draft.num_tokens), else the nearest dotted name."""
    def dotted(name: str) -> str:
        return f"{where}.{name}" if where else name
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.85) or difflib.get_close_matches(key, valid, n=2)
    if near:                                  # a plain misspelling is named alone
        return [dotted(name) for name in near]
    everywhere = _dotted_keys(root)
    names = difflib.get_close_matches(key, sorted({k.rpartition(".")[2] for k in everywhere}), n=1)
    near = [k for k in everywhere if names and k.rpartition(".")[2] == names[0]][:3]
    return near or difflib.get_close_matches(dotted(key), everywhere, n=2)


def _check_keys(node: Any, schema: Any, where: str, root: Any = None) -> None:
    """Every key in `node` must exist in `schema`; when one does not, name the nearest keys of the
    whole schema (`root`), with their sections, and the valid keys where it was given."""
    if not isinstance(node, DictConfig) or not isinstance(schema, DictConfig):
        return
    root = schema if root is None else root
    valid = [str(k) for k in schema.keys()]
    for key in node.keys():
        key = str(key)
        full = f"{where}.{key}" if where else key
        if key not in valid:
            hint = " or ".join(repr(k) for k in _nearest_keys(key, where, valid, root))
            raise ConfigError(f"unknown config key {full!r}" + (f" (did you mean {hint}?)" if hint else "")
                              + f"; valid keys{' under ' + repr(where) if where else ''}: {', '.join(valid)}")
        sub_schema = schema._get_node(key)
        if isinstance(sub_schema, DictConfig) and not sub_schema._is_none():
            _check_keys(node[key], sub_schema, full, root)


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
    check_values(cfg, schema_cls)
    return cfg


def _limit_problem(value: Any, limits: dict) -> str | None:
    """What is wrong with `value` under a field's limits (None: nothing)."""
    if value is None:
        return None
    if "choices" in limits and value not in limits["choices"]:
        return f"use one of: {', '.join('null' if c is None else str(c) for c in limits['choices'])}"
    if "item_choices" in limits and isinstance(value, (list, tuple, ListConfig)):
        wrong = [item for item in value if item not in limits["item_choices"]]
        if wrong:
            return f"{', '.join(map(str, wrong))}: every entry must be one of: {', '.join(map(str, limits['item_choices']))}"
        return None
    if "item_min" in limits and isinstance(value, (list, tuple, ListConfig)):
        if any(item < limits["item_min"] for item in value):
            return f"every entry must be >= {limits['item_min']}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "it must be a finite number"
    if "min" in limits and value < limits["min"]:
        return f"it must be >= {limits['min']}"
    if "above" in limits and not value > limits["above"]:
        return f"it must be > {limits['above']}"
    if "max" in limits and value > limits["max"]:
        return f"it must be <= {limits['max']}"
    return None


def check_values(cfg: Any, schema_cls, where: str = "") -> None:
    """Range-check every field of a loaded config against its `setting(...)` limits, descending
    into sections; a float is refused when NaN or infinite whatever its limits."""
    for f in dataclasses.fields(schema_cls):
        key = f"{where}.{f.name}" if where else f.name
        value = cfg[f.name]
        hint = _field_type(schema_cls, f.name)
        if dataclasses.is_dataclass(hint):
            if value is not None:
                check_values(value, hint, key)
            continue
        problem = _limit_problem(value, f.metadata.get("limits", {}))
        if problem is not None:
            shown = "null" if value is None else OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
            raise ConfigError(f"bad value for {key!r}: {shown!r}; {problem}")


def validate_spec_config(cfg) -> None:
    from .strategies import REGISTRY      # the one list of strategies
    STRATEGIES = tuple(REGISTRY)
    if cfg.strategy not in STRATEGIES:
        hint = difflib.get_close_matches(cfg.strategy, STRATEGIES, n=1)
        raise ConfigError(f"unknown strategy {cfg.strategy!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; valid strategies: {', '.join(STRATEGIES)}")
    if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
        raise ConfigError(f"bad value for 'device': {cfg.device!r}; use one of: auto, cpu, cuda, cuda:N")
    generation = {name: cfg.generation[name] for name in cfg.generation}
    check_generation_args(generation, prefix="generation.", error=ConfigError)


def load_spec_config(name_or_path: str | None = "autoregressive", overrides: dict | list | None = None):
    """The generation config `name_or_path` (a shipped name or a YAML path) with `overrides`, checked."""
    cfg = build_config(spec_config_class(), name_or_path, overrides)
    validate_spec_config(cfg)
    return cfg
