"""distill.json, the record `specdec train-draft` writes beside a distilled draft (a plain Hugging
Face checkpoint): the target it was distilled for (path, architecture, sizes, weight fingerprint)
and the recipe. Loading such a draft with another target warns, naming both."""
from __future__ import annotations

import json
import os
import warnings

from .io import fingerprints_match, target_identity

INFO_FILE = "distill.json"
FORMAT = "specdec-distilled-draft"


def read_distill_info(folder: str) -> dict | None:
    """distill.json of a draft folder (None when the draft was not made by train-draft)."""
    try:
        with open(os.path.join(folder, INFO_FILE)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == FORMAT else None


def warn_if_distilled_for_another_target(draft_path: str, target, target_path: str | None) -> bool:
    """Warn (UserWarning) when the draft at draft_path was distilled for a target other than
    `target`, naming both. Returns whether it warned."""
    info = read_distill_info(draft_path)
    if info is None:
        return False
    saved, current = info.get("target", {}), target_identity(target)
    same = (saved.get("architecture") == current["architecture"] and saved.get("vocab_size") == current["vocab_size"]
            and saved.get("hidden_size") == current["hidden_size"]
            and fingerprints_match(saved.get("fingerprint", []), current["fingerprint"]))
    if not same:
        warnings.warn(f"the draft {draft_path} was distilled for the target {saved.get('path', '?')}, but is loaded "
                      f"with the target {target_path or type(target).__name__}: outputs stay exact, but it drafts "
                      f"for the other model's distributions (lower acceptance). Distil it for this target with "
                      f"`specdec train-draft train_draft target=... draft={draft_path}`", UserWarning, stacklevel=2)
    return not same
