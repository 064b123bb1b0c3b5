"""`specdec train medusa|eagle|draft|early-exit|mtp [CONFIG] [key=value ...]`: one command for every drafter's
trainer (they share one loop, heads/loop.py), and `--help` listing each one's keys.

The older commands stay as aliases: `specdec train-heads [CONFIG]` (Medusa heads, or an EAGLE
drafter for a config with `drafter: eagle`) and `specdec train-draft [CONFIG]` (a draft model)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from specdec.config import build_config, find_config_file, parse_overrides
from specdec.errors import ConfigError

from . import distill, eagle_train, early_exit_train, train
from .config import TrainEagleConfig, TrainHeadsConfig, is_eagle_config
from .help import HELP_FLAGS, help_text, keys_help


@dataclass(frozen=True)
class Trainer:
    what: str                       # what it trains
    schema: type                    # its config dataclass
    config: str                     # its shipped config
    main: Callable[..., int]        # main(argv, cli=...): the trainer's command line


TRAINERS = {
    "medusa": Trainer("Medusa heads", TrainHeadsConfig, "train_heads", train.main),
    "eagle": Trainer("an EAGLE drafter", TrainEagleConfig, "train_eagle", eagle_train.main),
    "draft": Trainer("a draft model, distilled into its target", distill.TrainDraftConfig, "train_draft",
                     distill.main),
    "early-exit": Trainer("the target itself, fine-tuned to draft from its first layers (early_exit)",
                          early_exit_train.TrainEarlyExitConfig, "train_early_exit", early_exit_train.main),
    "mtp": Trainer("an MTP module in DeepSeek-V3's layout for a target that ships none (the EAGLE trainer, "
                   "layout=mtp: cross-entropy only)", TrainEagleConfig, "train_mtp", eagle_train.mtp_main),
}
USAGE = ("usage: specdec train {medusa,eagle,draft,early-exit,mtp} [CONFIG] [key=value ...]\n"
         "CONFIG: a shipped training config or a YAML path (none: the keys' defaults); values are YAML: "
         "corpus=[json, email] split_file=null;\nre-running with the same output_dir resumes. With no target "
         "it trains on the embedded default family. Aliases: `specdec train-heads` (medusa, or eagle for a\n"
         "config with `drafter: eagle`), `specdec train-draft` (draft).")


def kind_help(kind: str, name: str | None) -> str:
    """--help of `specdec train KIND [name]`: the keys, with the config's values (or the defaults)."""
    trainer = TRAINERS[kind]
    where = f" ({find_config_file(name)})" if name else ""
    values = "with this config's values" if name else "defaults"
    return (f"usage: specdec train {kind} [CONFIG] [key=value ...]\ntrains {trainer.what}{where}; shipped config: "
            f"{trainer.config}; keys ({values}):\n{keys_help(trainer.schema, name)}")


def overview() -> str:
    """--help of `specdec train`: each trainer and its keys (defaults)."""
    parts = [USAGE]
    for kind, trainer in TRAINERS.items():
        parts.append(f"specdec train {kind} [CONFIG]: {trainer.what} (shipped config: {trainer.config}); "
                     f"keys (defaults):\n{keys_help(trainer.schema, None)}")
    return "\n\n".join(parts)


def train_main(argv: list[str]) -> int:
    """specdec train KIND [CONFIG] [key=value ...]"""
    if not argv or argv[0] in HELP_FLAGS:
        print(overview())
        return 0
    kind, rest = argv[0], argv[1:]
    if kind not in TRAINERS:
        raise ConfigError(f"unknown trainer {kind!r}: specdec train takes one of {', '.join(TRAINERS)} "
                          f"(e.g. `specdec train medusa train_heads target=...`)")
    name = rest[0] if rest and "=" not in rest[0] and rest[0] not in HELP_FLAGS else None
    if any(arg in HELP_FLAGS for arg in rest):
        print(kind_help(kind, name))
        return 0
    if name is not None and kind not in ("eagle", "mtp") and is_eagle_config(name):
        raise ConfigError(f"{name!r} is an EAGLE training config (drafter: eagle): run it with "
                          f"`specdec train eagle {name}`")
    return TRAINERS[kind].main(with_default_family(TRAINERS[kind].schema, rest), cli=f"specdec train {kind}")


def with_default_family(schema, argv: list[str]) -> list[str]:
    """argv ([CONFIG] key=value ...) with the default family's paths added as overrides when the config
    gives no target (specdec/family/defaults.py training_defaults: built first when missing)."""
    from specdec.family.defaults import training_defaults
    name = argv[0] if argv and "=" not in argv[0] else None
    cfg = build_config(schema, name, parse_overrides(argv[1:] if name else argv))   # checked when training
    return argv + [f"{key}={json.dumps(value)}" for key, value in training_defaults(cfg).items()]


def main(argv: list[str]) -> int:
    """The alias `specdec train-heads [CONFIG] [key=value ...]`: Medusa heads, or an EAGLE drafter for a
    config with `drafter: eagle`."""
    name = argv[0] if argv and "=" not in argv[0] and argv[0] not in HELP_FLAGS else None
    if any(arg in HELP_FLAGS for arg in argv):
        print(help_text(name))
        return 0
    kind = "eagle" if name is not None and is_eagle_config(name) else "medusa"
    return TRAINERS[kind].main(with_default_family(TRAINERS[kind].schema, argv))


def draft_main(argv: list[str]) -> int:
    """The alias `specdec train-draft [CONFIG] [key=value ...]`."""
    if any(arg in HELP_FLAGS for arg in argv):
        return distill.main(argv)
    return distill.main(with_default_family(distill.TrainDraftConfig, argv))
