"""The embedded default model family (built by the project's own code; see issue 5)."""
from __future__ import annotations

from .errors import ModelLoadError


def apply_default_paths(cfg) -> None:
    raise ModelLoadError("no target model given: set target.path=/path/to/a/huggingface/checkpoint")
