"""Reading other tools' files: errors that name the file."""
from __future__ import annotations

import json

from specdec.errors import ModelLoadError


def read_json(path: str) -> dict:
    """The JSON object in `path`; ModelLoadError naming the file when it is unreadable or not one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is unreadable or not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data
