"""The embedded default model family, used when no target.path is given.

specdec.load("draft_model") with no paths builds (once, a few minutes on a CPU) and then
reuses a small family trained on the Python standard library's source (specdec.family):
its target, its draft and its Medusa heads fill whichever of target.path, draft.path and
heads.path are unset. $SPECDEC_FAMILY_CONFIG may name another family YAML (sizes, budget);
$SPECDEC_HOME moves the cache (default ~/.cache/specdec). A training config with no target
(`specdec train ...`) trains for the default family the same way (training_defaults)."""
from __future__ import annotations

import json
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


def built_family(warning: str):
    """The default family, built first (with `warning`, a warning of the "specdec" logger) when it is missing."""
    family_cfg = load_family_config(default_family_config_name())
    if not family_is_built(family_cfg):
        log.warning(warning)
    return ensure_family(family_cfg)


def apply_default_paths(cfg):
    """Fill cfg.target.path (and cfg.draft.path / cfg.heads.path / cfg.eagle.path when unset) with the default family,
    saying so (a warning of the "specdec" logger: on stderr unless logging says otherwise) when it has
    to be built first. Returns the family (its folders: target, draft, tokenizer, ...)."""
    family = built_family("specdec: no target.path given, so specdec uses its small embedded default model family, "
                          "which is not built yet: building it now (once, a few minutes on a 2-core CPU). "
                          "Give target.path=/path/to/checkpoint to use your own model instead.")
    cfg.target.path = family.target
    if cfg.draft.path is None:
        cfg.draft.path = family.draft
    if cfg.heads.path is None and family.heads is not None:
        cfg.heads.path = family.heads
    if cfg.eagle.path is None and family.eagle is not None:
        cfg.eagle.path = family.eagle
    return family


SPLIT_FILE = "split.json"      # the family's own train / held-out files, beside its tokenizer


def training_defaults(cfg) -> dict:
    """What a training config (Medusa, EAGLE or draft) with no target trains on: {key: value} for
    the keys to fill. The default family's target (built first, with a warning, when it is missing);
    its draft, for a draft trainer's unset draft (as specdec.load fills draft.path); and, when the
    config names no corpus of its own (no split_file, corpus or heldout), the family's own train /
    held-out split (so the drafter is evaluated on text its target never saw). {} when a target is
    given."""
    if cfg.target:
        return {}
    family = built_family("specdec: no target given, so the drafter is trained for specdec's small embedded default "
                          "model family, which is not built yet: building it now (once, a few minutes on a 2-core "
                          "CPU). Give target=/path/to/checkpoint to train one for your own model instead.")
    filled = {"target": family.target}
    if "draft" in cfg and cfg.draft is None:
        filled["draft"] = family.draft
    if not cfg.split_file and not list(cfg.corpus) and not list(cfg.heldout):
        split = os.path.join(family.tokenizer, SPLIT_FILE)
        filled["split_file"] = split
        if not cfg.corpus_root:
            with open(split) as f:
                filled["corpus_root"] = json.load(f)["root"]
    return filled
