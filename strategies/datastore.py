"""REST's datastore: token ids of a corpus and their suffix array, on disk, memory-mapped.

`build(token_streams, out_dir, fingerprint)` writes, in `out_dir`:
* tokens.bin: uint32 token ids of every stream, each stream followed by SEPARATOR (an id no token
  has), so no match and no continuation runs from one file into the next;
* suffix.bin: uint32 positions of tokens.bin, sorted by the SORT_DEPTH tokens that start there (a
  longer match is never asked for, so suffixes equal that far keep their positions' order);
* meta.json: the format and version, the tokenizer's fingerprint, the counts, and each file's size and
  sha256 (written last, atomically: a half-built datastore has none and is refused).

The sort is prefix doubling over ranks (numpy), SORT_DEPTH = 16 tokens in four rounds; the new ranks
of each round are computed in chunks, so building holds about 20 bytes per token (the token ids
themselves are read through the memory map).

`Datastore.open(dir, fingerprint)` maps both files read-only and refuses - saying which and what to do
- a folder that is not a datastore, a truncated or corrupt file, or one built with another tokenizer.
`longest_match(context)` is the longest suffix of the context (SORT_DEPTH down to min_match tokens) that
occurs in the corpus, as the range of suffix-array rows that start with it (binary search).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from specdec.atomic import atomic_write_json
from specdec.errors import ConfigError

FORMAT = "specdec-rest-datastore"
VERSION = 1
SEPARATOR = np.uint32(0xFFFFFFFF)
SORT_DEPTH = 16
CHUNK = 1 << 18                     # at most this many rows per step when ranks are recomputed (bounds the
#                                     temporaries: about 25 bytes a row)


class DatastoreError(ConfigError):
    """A datastore folder that cannot be used: what is wrong and what to do."""


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id) and its special tokens: two tokenizers with the
    same fingerprint map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return hashlib.sha256(json.dumps([vocab, special], ensure_ascii=False).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------- building
def write_tokens(streams: Iterable[Sequence[int]], path: Path) -> tuple[int, int]:
    """Append every stream and a SEPARATOR after it to `path` (uint32); (ids written, the largest token
    id, -1 for none)."""
    count, largest = 0, -1
    with open(path, "wb") as f:
        for stream in streams:
            ids = np.asarray(stream, dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= int(SEPARATOR)):
                raise DatastoreError(f"token ids must lie in [0, {int(SEPARATOR)}), got {ids.min()}..{ids.max()}")
            np.append(ids.astype(np.uint32), SEPARATOR).tofile(f)
            count += ids.size + 1
            largest = max(largest, int(ids.max()) if ids.size else -1)
    return count, largest


def suffix_array(tokens: np.ndarray, depth: int = SORT_DEPTH) -> np.ndarray:
    """[N] uint32 positions sorted by the `depth` tokens that start at each (prefix doubling; positions
    past the end sort first, and SEPARATOR after every token)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    tokens = np.asarray(tokens)
    separators = tokens == SEPARATOR
    largest = int(tokens[~separators].max()) if (~separators).any() else 0
    if largest >= (1 << 31) - 2:
        raise DatastoreError(f"token id {largest} is too large for the datastore (ids below {(1 << 31) - 2})")
    rank = tokens.astype(np.int32, casting="unsafe") + 1                 # [N] >= 1; a separator after every token
    rank[separators] = largest + 2
    del separators
    order = np.arange(n, dtype=np.uint32)
    span = 1
    while span < depth:
        key = rank.astype(np.int64)                                       # [N]: (rank here, rank span on)
        key <<= 32
        key[:-span] |= rank[span:]
        del order, rank                     # the last round's order and ranks are in `key` now: freed before the
        #                                     sort, so a round holds the key, the new order and the new ranks
        order = np.argsort(key).astype(np.uint32)    # argsort gives int64 indices; positions fit in 4 bytes
        rank = _ranks(key, order)
        del key
        span *= 2
    return order


def _ranks(key: np.ndarray, order: np.ndarray) -> np.ndarray:
    """[N] int32 dense ranks (>= 1) of `key` (sorted by `order`), equal keys equal ranks; in chunks."""
    rank = np.empty(len(key), dtype=np.int32)
    current, previous = 0, None
    chunk = max(4096, min(CHUNK, len(order) // 8))      # a small datastore's temporaries stay small too
    for start in range(0, len(order), chunk):
        rows = order[start: start + chunk]
        sorted_key = key[rows]
        new = np.empty(len(rows), dtype=bool)
        new[0] = previous is None or sorted_key[0] != previous
        new[1:] = sorted_key[1:] != sorted_key[:-1]
        ranks = current + np.cumsum(new, dtype=np.int64)
        rank[rows] = ranks
        current, previous = int(ranks[-1]), sorted_key[-1]
    return rank


def build(streams: Iterable[Sequence[int]], out_dir: str | os.PathLike, fingerprint: str,
          progress: Callable[[str], None] | None = None) -> dict:
    """Write the datastore of `streams` (token id lists) into out_dir; returns its meta."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta_path.unlink()                      # a rebuilt folder is not a datastore until it is whole again
    tokens_path, suffix_path = out / "tokens.bin", out / "suffix.bin"
    count, largest = write_tokens(streams, tokens_path)
    if progress:
        progress(f"{count} token ids written; sorting their suffixes")
    tokens = np.memmap(tokens_path, dtype=np.uint32, mode="r") if count else np.zeros(0, dtype=np.uint32)
    suffix_array(tokens).tofile(suffix_path)
    del tokens
    meta = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "tokens": count, "max_token": largest,
            "sort_depth": SORT_DEPTH,
            "files": {name: {"bytes": (out / name).stat().st_size, "sha256": _sha256(out / name)}
                      for name in ("tokens.bin", "suffix.bin")}}
    atomic_write_json(meta_path, meta)
    if progress:
        progress(f"datastore written to {out}")
    return meta


# ---------------------------------------------------------------------- reading
class Datastore:
    """A built datastore, its files memory-mapped read-only."""

    def __init__(self, path: Path, meta: dict, tokens: np.ndarray, suffix: np.ndarray):
        self.path, self.meta, self.tokens, self.suffix = path, meta, tokens, suffix

    @classmethod
    def open(cls, path: str | os.PathLike, fingerprint: str | None) -> "Datastore":
        """The datastore in `path`, checked whole and built with the tokenizer of `fingerprint` (None:
        not checked)."""
        folder = Path(path).expanduser()
        rebuild = f"rebuild it with `specdec index FILES... --out {folder} --tokenizer TARGET`"
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise DatastoreError(f"{folder} is not a REST datastore (no meta.json; an interrupted build leaves "
                                 f"none): {rebuild}")
        try:
            meta = json.loads(meta_path.read_text())
            files = meta["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DatastoreError(f"the datastore {folder} has an unreadable meta.json ({exc}): {rebuild}") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise DatastoreError(f"{folder} holds format {meta.get('format')!r} version {meta.get('version')!r}; this "
                                 f"specdec reads {FORMAT!r} version {VERSION}: {rebuild}")
        if fingerprint is not None and meta.get("fingerprint") != fingerprint:
            raise DatastoreError(f"the datastore {folder} was built with another tokenizer than the target's (its "
                                 f"token ids would mean other text): {rebuild}, or use the target it was built for")
        for name in ("tokens.bin", "suffix.bin"):
            file = folder / name
            expected = files.get(name, {})
            size = file.stat().st_size if file.is_file() else None
            if size != expected.get("bytes"):
                raise DatastoreError(f"the datastore file {file} is truncated or missing ({size} of "
                                     f"{expected.get('bytes')} bytes): {rebuild}")
            if _sha256(file) != expected.get("sha256"):
                raise DatastoreError(f"the datastore file {file} is corrupt (its sha256 is not the one recorded at "
                                     f"build): {rebuild}")
        count = int(meta["tokens"])
        if count == 0:
            empty = np.zeros(0, dtype=np.uint32)
            return cls(folder, meta, empty, empty)
        return cls(folder, meta, np.memmap(folder / "tokens.bin", dtype=np.uint32, mode="r"),
                   np.memmap(folder / "suffix.bin", dtype=np.uint32, mode="r"))

    def __len__(self) -> int:
        return len(self.tokens)

    def _compare(self, row: int, query: Sequence[int]) -> int:
        """-1 / 0 / 1: the suffix at suffix-array row `row` against `query`, on len(query) tokens."""
        start = int(self.suffix[row])
        window = self.tokens[start: start + len(query)].tolist()
        for have, want in zip(window, query):
            if have != want:
                return -1 if have < want else 1
        return 0 if len(window) == len(query) else -1       # cut by the end: shorter sorts first

    def find(self, query: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the suffix-array rows whose suffix starts with `query` (len <= sort depth)."""
        lo, hi = 0, len(self.suffix)
        while lo < hi:                                    # first row >= query
            mid = (lo + hi) // 2
            if self._compare(mid, query) < 0:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(self.suffix)
        while lo < hi:                                    # first row > query
            mid = (lo + hi) // 2
            if self._compare(mid, query) <= 0:
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def longest_match(self, context: Sequence[int], min_length: int = 2,
                      max_length: int = SORT_DEPTH) -> tuple[int, int, int]:
        """(length, lo, hi) of the longest suffix of `context` (max_length down to min_length tokens) that
        occurs in the corpus, with its suffix-array rows; (0, 0, 0) when none does. A longer suffix occurs
        only where each shorter one does, so the lengths are tried from the shortest up."""
        best = (0, 0, 0)
        for length in range(min_length, min(max_length, self.meta["sort_depth"], len(context)) + 1):
            lo, hi = self.find(context[len(context) - length:])
            if lo == hi:
                break
            best = (length, lo, hi)
        return best

    def continuations(self, lo: int, hi: int, length: int, depth: int, limit: int) -> list[list[int]]:
        """The `depth` tokens after the match of `length` at up to `limit` of the rows lo..hi (each cut
        at a separator)."""
        found = []
        for row in range(lo, min(hi, lo + limit)):
            start = int(self.suffix[row]) + length
            tokens = self.tokens[start: start + depth].tolist()
            if int(SEPARATOR) in tokens:
                tokens = tokens[: tokens.index(int(SEPARATOR))]
            if tokens:
                found.append(tokens)
        return found
