"""Where a family lives on disk and how it gets there safely.

    <cache>/default-<hash>/
        tokenizer/ target/ draft/ heads/   each built in a temp folder, renamed into place (specdec.atomic),
                                           with a PART_COMPLETE marker (the hash) inside
        target.training/                   the target's pretraining run (its checkpoint), kept until
                                           target/ is in place: a rerun goes on from it
        family.yaml                        the config it was built from
        COMPLETE                           the hash, written last: only then is it loaded

<cache> is $SPECDEC_HOME, else $XDG_CACHE_HOME/specdec, else ~/.cache/specdec. A folder
without COMPLETE (an interrupted build) is never loaded; its parts whose marker matches
are kept, the others rebuilt.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from typing import Callable, Iterator

from specdec.atomic import atomic_folder, atomic_write_text

COMPLETE = "COMPLETE"
PART_COMPLETE = "PART_COMPLETE"


def cache_root() -> str:
    if os.environ.get("SPECDEC_HOME"):
        return os.path.abspath(os.path.expanduser(os.environ["SPECDEC_HOME"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "specdec")


def family_folder(config_hash: str) -> str:
    return os.path.join(cache_root(), f"default-{config_hash}")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def is_complete(folder: str, config_hash: str) -> bool:
    return _read(os.path.join(folder, COMPLETE)) == config_hash


def mark_complete(folder: str, config_hash: str) -> None:
    atomic_write_text(os.path.join(folder, COMPLETE), config_hash + "\n")


def part_is_complete(folder: str, part: str, config_hash: str) -> bool:
    return _read(os.path.join(folder, part, PART_COMPLETE)) == config_hash


def build_part(folder: str, part: str, config_hash: str, build: Callable[[str], None]) -> str:
    """Run build(tmp_folder), mark it, and rename it to folder/part (replacing any stale one).
    An exception leaves no folder/part behind that could pass for a finished one."""
    final = os.path.join(folder, part)

    def build_and_mark(tmp: str) -> None:
        build(tmp)
        atomic_write_text(os.path.join(tmp, PART_COMPLETE), config_hash + "\n")
    atomic_folder(final, build_and_mark)
    return final


def work_folder(folder: str, part: str) -> str:
    """Where a part's training run lives while the part is being built (resumable, unlike its temp folder)."""
    return os.path.join(folder, f"{part}.training")


def remove_stale(folder: str, keep: set[str]) -> None:
    """Delete everything in folder except the names in `keep` (leftovers of an interrupted build)."""
    for name in os.listdir(folder):
        if name in keep or name.endswith(".lock"):
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


@contextlib.contextmanager
def build_lock(folder: str) -> Iterator[None]:
    """One builder per family at a time; a second process waits, then finds it complete."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".build.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
