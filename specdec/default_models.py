"""The embedded default model family, used when no target.path is given.

specdec.load("draft_model") with no paths builds (once, a few minutes on a CPU) and then
reuses a small family trained on the Python standard library's source (specdec.builder):
its target, its draft and its Medusa heads fill whichever of target.path, draft.path and
heads.path are unset. $SPECDEC_FAMILY_CONFIG may name another family YAML (sizes, budget);
$SPECDEC_HOME moves the cache (default ~/.cache/specdec)."""
from __future__ import annotations

import os

from .builder import FamilyPaths, ensure_family, load_family_config
from .builder.config import DEFAULT_FAMILY_CONFIG


def default_family_config_name() -> str:
    return os.environ.get("SPECDEC_FAMILY_CONFIG") or DEFAULT_FAMILY_CONFIG


def default_family() -> FamilyPaths:
    """The default family's paths, building it first when it is missing or half-built."""
    return ensure_family(load_family_config(default_family_config_name()))


def apply_default_paths(cfg) -> None:
    """Fill cfg.target.path (and cfg.draft.path / cfg.heads.path when unset) with the default family."""
    family = default_family()
    cfg.target.path = family.target
    if cfg.draft.path is None:
        cfg.draft.path = family.draft
    if cfg.heads.path is None and family.heads is not None:
        cfg.heads.path = family.heads
