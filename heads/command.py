"""`specdec train-heads [CONFIG] [key=value ...]`: the trainer the config names (Medusa heads, or an
EAGLE drafter for a config with `drafter: eagle`), and `--help` for each training config (heads/help.py)."""
from __future__ import annotations

from . import eagle_train, train
from .config import is_eagle_config
from .help import HELP_FLAGS, help_text


def main(argv: list[str]) -> int:
    name = argv[0] if argv and "=" not in argv[0] and argv[0] not in HELP_FLAGS else None
    if any(arg in HELP_FLAGS for arg in argv):
        print(help_text(name))
        return 0
    trainer = eagle_train if name is not None and is_eagle_config(name) else train
    return trainer.main(argv)
