"""REST's datastore: token ids of a corpus and their suffix array, on disk, memory-mapped.

`build(token_streams, out_dir, fingerprint)` writes, in `out_dir`:
* tokens.bin: uint32 token ids of every stream, each stream followed by SEPARATOR (an id no token
  has), so no match and no continuation runs from one file into the next;
* suffix.bin: uint32 positions of tokens.bin, sorted by the SORT_DEPTH tokens that start there (a
  longer match is never asked for, so suffixes equal that far keep their positions' order);
* meta.json: the format and version, the tokenizer's fingerprint, the counts, and each file's size and
  sha256 (written last, atomically: a half-built datastore has none and is refused).

The sort is prefix doubling over ranks (numpy), SORT_DEPTH = 16 tokens in at most four rounds. Each
round re-sorts, in chunks, the runs of rows whose ranks are still equal, in place: building holds the
order and two ranks, 12 bytes per token, beside one chunk's temporaries (the token ids themselves are
read from the file in chunks).

`Datastore.open(dir, fingerprint)` maps both files read-only and refuses - saying which and what to do
- a folder that is not a datastore, a truncated or corrupt file, or one built with another tokenizer.
`longest_match(context)` is the longest suffix of the context (SORT_DEPTH down to min_match tokens) that
occurs in the corpus, as the range of suffix-array rows that start with it (binary search).
"""
from __future__ import annotations

import bisect
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
CHUNK = 1 << 18                     # rows per step of the sort's chunked work (bounds its temporaries, about 50
#                                     bytes a row; a run of equal ranks longer than this is one step)


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
    past the end sort first, and SEPARATOR after every token), equal ones in their positions' order.
    `tokens`: an array, or anything whose slices are arrays (read once, in chunks)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    if n + depth >= 1 << 31:               # ranks and positions are 32-bit
        raise DatastoreError(f"{n} token ids are too many for one datastore (fewer than {(1 << 31) - depth}); "
                             f"index the files in parts")
    step = _chunk(n)
    rank = np.zeros(n + depth, dtype=np.int32)     # [N + depth] >= 1; a separator after every token; 0 past the end
    largest, too_large = -1, False
    for start in range(0, n, step):        # the ids are read in chunks: no wider copy of them all
        ranks = rank[start: min(start + step, n)]
        ranks[:] = np.asarray(tokens[start: start + step], dtype=np.uint32).view(np.int32)   # a separator reads -1
        largest = max(largest, int(ranks.max()))
        too_large |= bool((ranks < -1).any())                             # ids of 2^31 and up read negative
        ranks += 1                                                       # a separator: 0 for now
    if too_large or largest >= (1 << 31) - 2:
        raise DatastoreError(f"a token id is too large for the datastore (ids below {(1 << 31) - 2})")
    for start in range(0, n, step):        # separators after every token, now that the largest is known
        ranks = rank[start: min(start + step, n)]
        ranks[ranks == 0] = largest + 2
    del ranks                              # a view: it would keep this first rank array alive through the rounds
    if largest + 2 <= max(2 * n, 1 << 16):
        order = _counting_order(rank[:n], largest + 2)
    else:                                  # few tokens of large ids: a count per id would outweigh the tokens
        order = np.argsort(rank[:n], kind="stable").astype(np.uint32)
    span = 1
    while span < depth:
        rank, distinct = _refine(order, rank, span)
        if distinct == n:                  # every suffix told apart: longer prefixes change no order
            break
        span *= 2
    return order


def _chunk(n: int) -> int:
    """Rows per step of the sort's chunked work: a small datastore's temporaries stay small too."""
    return max(4096, min(CHUNK, n // 8))


def _counting_order(rank: np.ndarray, largest: int) -> np.ndarray:
    """[N] uint32 positions stably sorted by `rank` (values 1..largest), a counting sort in chunks: it holds
    the order and the counts, never an index of 8 bytes a row."""
    n = len(rank)
    offsets = np.zeros(largest + 2, dtype=np.int64)                     # where each value's rows start
    offsets[1:] = np.cumsum(np.bincount(rank, minlength=largest + 1))
    order = np.empty(n, dtype=np.uint32)
    step = _chunk(n)
    for start in range(0, n, step):
        values = rank[start: start + step]
        local = np.argsort(values, kind="stable")                        # [C]
        ordered = values[local]
        within = np.arange(len(values)) - np.searchsorted(ordered, ordered, side="left")   # rank among equals
        order[offsets[ordered] + within] = start + local
        offsets[:-1] += np.bincount(values, minlength=largest + 1)
    return order


def _refine(order: np.ndarray, rank: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """One prefix-doubling round: `order` (positions sorted by their first `span` tokens, whose dense ranks
    `rank` holds, with room of at least `span` zeros past the end) re-sorted in place by (rank here, rank
    `span` on), stably; returns (the new dense ranks, how many distinct there are). Rows of equal rank are
    contiguous in `order`, so the work goes in chunks cut between such runs: the round holds the order and both
    ranks (12 bytes a row) beside one chunk's temporaries."""
    n = len(order)
    new_rank = np.zeros(len(rank), dtype=np.int32)                      # [N + span room] (0 past the end)
    counter = 0
    start, step = 0, _chunk(n)
    while start < n:
        stop = min(start + step, n)
        if stop < n:                       # on to the end of the run of equal rank that row stop - 1 is in
            stop = bisect.bisect_right(order, rank[order[stop - 1]], lo=stop, hi=n, key=rank.__getitem__)
        rows = order[start: stop]                                         # [C] positions (a view)
        if rank[rows[0]] == rank[rows[-1]]:     # one run (ranks do not decrease along the order): its rank span on
            key = rank[rows + span]                                       # [C] int32
        else:                                   # (rank here, rank span on)
            key = rank[rows].astype(np.int64)                             # [C]
            key <<= 32
            key |= rank[rows + span]
        local = np.argsort(key, kind="stable")
        order[start: stop] = rows[local]
        del local
        key.sort(kind="stable")                # what key[local] holds, in place: no second copy
        new = np.empty(len(key), dtype=bool)
        new[0] = True                          # a chunk starts a run: its first key differs from the last chunk's
        np.not_equal(key[1:], key[:-1], out=new[1:])
        del key
        ranks = np.cumsum(new, dtype=np.int32)  # ranks stay below N < 2^31 (suffix_array refuses more)
        ranks += counter
        new_rank[order[start: stop]] = ranks
        counter = int(ranks[-1])
        start = stop
    return new_rank, counter


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
    suffix_array(_FileTokens(tokens_path, count)).tofile(suffix_path)
    meta = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "tokens": count, "max_token": largest,
            "sort_depth": SORT_DEPTH,
            "files": {name: {"bytes": (out / name).stat().st_size, "sha256": _sha256(out / name)}
                      for name in ("tokens.bin", "suffix.bin")}}
    atomic_write_json(meta_path, meta)
    if progress:
        progress(f"datastore written to {out}")
    return meta


class _FileTokens:
    """tokens.bin's ids read by slices from the file, for the sort's chunked reads: mapped, the pages read would
    stay resident through the sort (a twelfth of its peak)."""

    def __init__(self, path: Path, count: int):
        self.path, self.count = path, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.count)
        return np.fromfile(self.path, dtype=np.uint32, count=max(stop - start, 0), offset=start * 4)


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
        at a separator): all of them, or `limit` spread evenly over the range. The rows are sorted by what
        follows the match, so its first `limit` rows would hold the continuations of the smallest ids, whatever
        the corpus's counts."""
        found = []
        count = hi - lo
        rows = range(lo, hi) if count <= limit else (lo + i * count // limit for i in range(limit))
        for row in rows:
            start = int(self.suffix[row]) + length
            tokens = self.tokens[start: start + depth].tolist()
            if int(SEPARATOR) in tokens:
                tokens = tokens[: tokens.index(int(SEPARATOR))]
            if tokens:
                found.append(tokens)
        return found
