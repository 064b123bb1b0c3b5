"""The embedded default model family, used when no target.path is given.

specdec.load("draft_model") with no paths builds (once, a few minutes on a CPU) and then
reuses a small family trained on the Python standard library's source (specdec.family):
its target, its draft and its Medusa heads fill whichever of target.path, draft.path and
heads.path are unset. $SPECDEC_FAMILY_CONFIG may name another family YAML (sizes, budget);
$SPECDEC_HOME moves the cache (default ~/.cache/specdec)."""
from __future__ import annotations

import logging
import os

from . import FamilyPaths, ensure_family, family_is_built, load_family_config
from .config import DEFAULT_FAMILY_CONFIG

log = logging.getLogger(__name__)


def default_family_config_name() -> str:
    return os.environ.get("SPECDEC_FAMILY_CONFIG") or DEFAULT_FAMILY_CONFIG


def default_family() -> FamilyPaths:
    """The default family's paths, building it first when it is missing or half-built."""
    return ensure_family(load_family_config(default_family_config_name()))


def apply_default_paths(cfg) -> None:
    """Fill cfg.target.path (and cfg.draft.path / cfg.heads.path / cfg.eagle.path when unset) with the default family,
    saying so (a warning of the "specdec" logger: on stderr unless logging says otherwise) when it has
    to be built first."""
    family_cfg = load_family_config(default_family_config_name())
    if not family_is_built(family_cfg):
        log.warning("specdec: no target.path given, so specdec uses its small embedded default model family, "
                    "which is not built yet: building it now (once, about 6 minutes on a 2-core CPU). "
                    "Give target.path=/path/to/checkpoint to use your own model instead.")
    family = ensure_family(family_cfg)
    cfg.target.path = family.target
    if cfg.draft.path is None:
        cfg.draft.path = family.draft
    if cfg.heads.path is None and family.heads is not None:
        cfg.heads.path = family.heads
    if cfg.eagle.path is None and family.eagle is not None:
        cfg.eagle.path = family.eagle
