"""Files (and folders of files) written so that a reader finds the old version or the new one whole,
never a part of one - also after a crash or a power cut.

Every write goes to a temporary file beside its destination (the same folder, so the same file
system), is flushed and fsynced, then renamed onto the destination (os.replace, atomic on POSIX and
Windows), and the folder is fsynced so that the rename itself is on disk (where a folder can be
opened: not on Windows). A write that fails - the serializer raises, the disk is full, Ctrl-C -
removes its temporary file and leaves the destination as it was. Files and folders get the usual
modes (0o666 and 0o777 less the umask), as open() and os.makedirs give: a saved folder is readable
by whom a folder made by hand would be.

    atomic_write(path, lambda tmp: torch.save(state, tmp))    any writer that takes a path
    atomic_write_json(path, data, indent=2)                   also _text, _bytes
    atomic_folder(path, build)                                build(tmp_folder) fills a folder, put at path whole
    atomic_files_into(folder, write)                          write(tmp_folder)'s files, each moved into folder whole
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from typing import Any, Callable

def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> None:
    """Call write(temp_path), a temporary file in the folder of `path` (made if missing), then fsync
    it and rename it onto `path`."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = _new_temp_file(folder, os.path.basename(path))
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_folder(folder)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding=encoding) as f:
            f.write(text)
    atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any, **dump_options) -> None:
    """`data` as JSON (json.dump's keyword arguments: indent, separators, default, ...)."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, **dump_options)
    atomic_write(path, write)


def atomic_folder(path: str | os.PathLike, build: Callable[[str], Any]) -> None:
    """Call build(temp_folder), a new folder beside `path`, then fsync what it holds and rename it to
    `path`. A folder already at `path` is deleted just before: between the two a reader finds no
    folder (never a part of one); a reader that must not see that gap checks a marker written
    after (family/store.py's COMPLETE). A failed build leaves no temporary folder behind."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = _new_temp_folder(parent, f".{os.path.basename(path)}.building-")
    try:
        build(tmp)
        _fsync_tree(tmp)
        if os.path.lexists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    _fsync_folder(parent)


def atomic_files_into(folder: str | os.PathLike, write: Callable[[str], Any]) -> None:
    """Call write(temp_folder), a new folder inside `folder`, then fsync the files it wrote and move
    each into `folder` (replacing a file of the same name): each file is whole, old or new. A failed
    write moves nothing and leaves no temporary folder behind."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tmp = _new_temp_folder(folder, ".files-")
    try:
        write(tmp)
        _fsync_tree(tmp)
        for name in sorted(os.listdir(tmp)):
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_folder(folder)


# ---------------------------------------------------------------------- helpers
def _new_temp_file(folder: str, name: str) -> str:
    """An empty new file `.<name>.<random>.tmp` in `folder`, created with the usual mode."""
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _new_temp_folder(parent: str, prefix: str) -> str:
    """An empty new folder `<prefix><random>` in `parent`, made with the usual mode (tempfile.mkdtemp
    would make it 0o700, and the folder is renamed into place as it is)."""
    while True:
        tmp = os.path.join(parent, f"{prefix}{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


def _fsync_file(path: str) -> None:
    """Flush a file that its writer has closed to the disk (Windows fsyncs only writable handles)."""
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: str) -> None:
    """Put a folder's entries (a rename into it) on disk, where the platform and file system allow."""
    if os.name == "nt":                       # a folder cannot be opened there
        return
    with contextlib.suppress(OSError):        # some file systems refuse to fsync a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(folder: str) -> None:
    """Every file under `folder`, then every folder, deepest first."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                _fsync_file(path)
        _fsync_folder(root)
