"""specdec.atomic: the one way files that are read back later get written."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specdec import atomic
from specdec.atomic import (atomic_files_into, atomic_folder, atomic_write, atomic_write_bytes, atomic_write_json,
                            atomic_write_text)


class Unserializable:
    pass


def test_a_failed_json_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "data.json"
    atomic_write_json(path, {"version": 1})
    with pytest.raises(TypeError):          # json.dump has written part of the file when it meets the object
        atomic_write_json(path, {"version": 2, "entries": list(range(1000)), "bad": Unserializable()})
    assert json.loads(path.read_text()) == {"version": 1}
    assert os.listdir(tmp_path) == ["data.json"]


def test_a_writer_that_raises_part_way_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "weights.pt"
    atomic_write(path, lambda tmp: torch.save({"w": torch.ones(3)}, tmp))

    def half_then_fail(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half a checkpoint")
        raise KeyboardInterrupt              # Ctrl-C part way: also cleaned up
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_fail)
    assert torch.equal(torch.load(path)["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["weights.pt"]


def test_writes_replace_the_file_with_the_usual_mode_and_make_the_folder(tmp_path):
    path = tmp_path / "new" / "folder" / "cache.bin"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    atomic_write_text(tmp_path / "note.txt", "é\n")
    assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "é\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == 0o666 & ~umask     # as open() makes it, not mkstemp's 0600
    assert os.listdir(path.parent) == ["cache.bin"]


def test_the_file_and_its_folder_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)
    monkeypatch.setattr(atomic.os, "fsync", recording_fsync)
    path = tmp_path / "profile.json"
    atomic_write_json(path, {"sizes": [1, 2]})
    assert path.stat().st_ino in synced                 # the data (the temp file, renamed: same inode)
    if os.name != "nt":
        assert tmp_path.stat().st_ino in synced         # the rename


def test_a_failed_folder_build_leaves_the_old_folder_and_no_temp_folder(tmp_path):
    final = tmp_path / "part"

    def build(folder, text):
        (Path(folder) / "sub").mkdir()
        (Path(folder) / "sub" / "a.txt").write_text(text)
    atomic_folder(final, lambda tmp: build(tmp, "old"))
    assert (final / "sub" / "a.txt").read_text() == "old"

    def fail(tmp):
        build(tmp, "new")
        raise RuntimeError("the build fails")
    with pytest.raises(RuntimeError):
        atomic_folder(final, fail)
    assert (final / "sub" / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["part"]
    atomic_folder(final, lambda tmp: build(tmp, "new"))                 # a finished build replaces it
    assert (final / "sub" / "a.txt").read_text() == "new" and os.listdir(tmp_path) == ["part"]


def test_files_written_into_a_folder_move_in_whole_or_not_at_all(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"kept")
    (tmp_path / "config.json").write_text("old")

    def write(tmp, fail):
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write("new")
        with open(os.path.join(tmp, "model.safetensors"), "w") as f:
            f.write("weights")
        if fail:
            raise OSError("disk full")
    with pytest.raises(OSError):
        atomic_files_into(tmp_path, lambda tmp: write(tmp, fail=True))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "config.json"]
    assert (tmp_path / "config.json").read_text() == "old"
    atomic_files_into(tmp_path, lambda tmp: write(tmp, fail=False))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "config.json", "model.safetensors"]
    assert (tmp_path / "config.json").read_text() == "new" and (tmp_path / "checkpoint.pt").read_bytes() == b"kept"


def test_a_saved_folder_gets_the_mode_a_plain_makedirs_gives(tmp_path):
    """Readable by other users as a folder made by hand is (not tempfile.mkdtemp's 0700), files inside too."""
    def build(folder):
        (Path(folder) / "sub").mkdir()
        (Path(folder) / "config.json").write_text("{}")
    old_umask = os.umask(0o022)
    try:
        atomic_folder(tmp_path / "model", build)
        os.makedirs(tmp_path / "by_hand")
    finally:
        os.umask(old_umask)
    mode = lambda path: path.stat().st_mode & 0o777        # noqa: E731
    assert mode(tmp_path / "model") == mode(tmp_path / "by_hand") == 0o755
    assert mode(tmp_path / "model" / "sub") == 0o755 and mode(tmp_path / "model" / "config.json") == 0o644
