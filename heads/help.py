"""--help of the training commands: each training config's keys with the values it gives them
(`specdec train-heads [CONFIG] --help` - without a config: the shipped training configs and Medusa's
keys -, the trainers' own entry points, `specdec train-draft --help`)."""
from __future__ import annotations

import dataclasses
import json

from omegaconf import OmegaConf

from specdec.config import build_config, find_config_file, shipped_config_names
from specdec.config_reference import field_comments

from .config import TrainEagleConfig, TrainHeadsConfig, is_eagle_config

HELP_FLAGS = ("-h", "--help")
USAGE = ("usage: specdec train-heads [CONFIG] [key=value ...]  (an alias of `specdec train medusa|eagle`)\n"
         "CONFIG: a shipped training config or a YAML path (a YAML with `drafter: eagle` trains an EAGLE drafter);\n"
         "values are YAML: corpus=[json, email] split_file=null; re-running with the same output_dir resumes")


def trained_by(name: str | None) -> tuple[type, str]:
    """(schema, what it trains) of a `specdec train-heads` config name or path (None: Medusa heads)."""
    if name is not None and is_eagle_config(name):
        return TrainEagleConfig, "an EAGLE drafter"
    return TrainHeadsConfig, "Medusa heads"


def training_configs() -> list[tuple[str, str]]:
    """(name, what it trains) of every training config shipped in configs/."""
    names = sorted(set(shipped_config_names("", TrainHeadsConfig)) | set(shipped_config_names("", TrainEagleConfig)))
    return [(name, trained_by(name)[1]) for name in names]


def _shown(value) -> str:
    """A config value as it is written in an override (YAML): null, true, [a, b]."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if isinstance(value, str):
        return value
    return json.dumps(value).replace("NaN", ".nan")


def keys_help(schema, name: str | None) -> str:
    """One line per key of `schema`: `key = value  # what it is`, the value the config `name` gives it
    (the schema's default when the config does not set it, or when there is no config) and the
    comment written beside the field in the source."""
    cfg = build_config(schema, name)            # defaults <- the YAML; checked later, when training
    notes = field_comments(schema)
    width = max(len(f.name) for f in dataclasses.fields(schema))
    lines = [(f.name, _shown(cfg[f.name])) for f in dataclasses.fields(schema)]
    value_width = min(24, max(len(value) for _, value in lines))
    return "\n".join(f"  {key:<{width}} = {value:<{value_width}}  # {notes[key]}".rstrip() if notes.get(key)
                     else f"  {key:<{width}} = {value}" for key, value in lines)


def help_text(name: str | None, eagle: bool = False) -> str:
    """--help of `specdec train-heads [name]` (eagle: of the EAGLE trainer's own entry point)."""
    schema, what = trained_by(name)
    if eagle and name is None:
        return (f"usage: specdec train-heads train_eagle [key=value ...]  (or a YAML with `drafter: eagle`)\n"
                f"without a config: an EAGLE drafter; keys (defaults):\n{keys_help(TrainEagleConfig, None)}")
    if name is None:
        listing = "\n".join(f"  {config:<12} {trains}" for config, trains in training_configs())
        return (f"{USAGE}\n\nshipped training configs (`specdec train-heads CONFIG --help` lists one's keys):\n"
                f"{listing}\n\nwithout a config: {what}; keys (defaults):\n{keys_help(schema, None)}")
    return (f"usage: specdec train-heads {name} [key=value ...]\n"
            f"trains {what} ({find_config_file(name)}); keys, with this config's values:\n{keys_help(schema, name)}")
