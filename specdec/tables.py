"""Per-shape tables that belong to someone, and the bounded caches of pure shape functions.

A tree shape's index tensors on a device (its mask, positions and paths: tree.TreeShape; acceptance's
rejection index: acceptance.TreeIndex; a static Medusa tree's rank index) are built once per shape
and reused every step it recurs, so a step sends nothing from the host for a shape it has seen. They
are kept by the object that uses them, in a ShapeTables of its own: the verifier's (its Speculator's,
shared by its calls) or a drafter's. Dropping the owner frees them, and each owner keeps at most
TABLE_BYTES (its tables' tensors and their keys) and TABLE_SHAPES shapes, the least recently used
dropped first. A Speculator so holds at most 32 MiB of tables in its verifier, and as much again in
each drafter that keeps some (draft model, EAGLE, Medusa); the module-level host caches of pure
shape functions (small_shape_cache) hold under 6 MiB for the whole process.

A prefill never makes a table: its chunks are chains (padded in a batch), whose masks are arithmetic
(tree.chain_visibility), so a new prompt length adds nothing here.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections import OrderedDict
from typing import Callable, Hashable

import torch

TABLE_BYTES = 32 * 2**20        # per owner: bytes kept (its tables' tensors, on their device, and their keys)
TABLE_SHAPES = 512              # per owner: shapes kept (the old module-wide cache's size)


def tensor_bytes(value) -> int:
    """Bytes of the storages behind the tensors in `value` (a tensor, or a dataclass, tuple, list or
    dict holding tensors), each storage counted once (views of one table share it)."""
    storages: dict[tuple, int] = {}

    def visit(item) -> None:
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(item.device, storage.data_ptr())] = storage.nbytes()
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for f in dataclasses.fields(item):
                visit(getattr(item, f.name))
        elif isinstance(item, (tuple, list)):
            for part in item:
                visit(part)
        elif isinstance(item, dict):
            for part in item.values():
                visit(part)

    visit(value)
    return sum(storages.values())


def key_bytes(key) -> int:
    """Host bytes of a table's key (a parents tuple, a tuple of paths), each int counted as an object
    of its own (an overestimate: small ints are shared)."""
    if isinstance(key, tuple):
        return sys.getsizeof(key) + sum(key_bytes(part) for part in key)
    return sys.getsizeof(key)


class ShapeTables:
    """`get(build, key, device)` = build(key, device), built once per (build, key, device) while it is
    kept: at most max_bytes (tensor_bytes of the tables + key_bytes of their keys) and max_shapes
    entries, the least recently used evicted first. A table larger than max_bytes is returned but not kept. An evicted shape that
    recurs is built (and copied to the device) again: the outputs are the same, the copy is one more.
    Thread-safe: a Speculator's overlapping calls share their verifier's tables."""

    def __init__(self, max_bytes: int = TABLE_BYTES, max_shapes: int = TABLE_SHAPES):
        self.max_bytes, self.max_shapes = int(max_bytes), int(max_shapes)
        self._kept: OrderedDict[tuple, tuple[object, int]] = OrderedDict()    # key -> (table, bytes)
        self.nbytes = 0
        self._lock = threading.Lock()

    def get(self, build: Callable, key: Hashable, device: torch.device):
        entry = (build, key, device)
        with self._lock:
            hit = self._kept.get(entry)
            if hit is not None:
                self._kept.move_to_end(entry)
                return hit[0]
        table = build(key, device)              # outside the lock: a build may take a while
        size = tensor_bytes(table) + key_bytes(key)
        with self._lock:
            if size <= self.max_bytes and entry not in self._kept:
                self._kept[entry] = (table, size)
                self.nbytes += size
                while self.nbytes > self.max_bytes or len(self._kept) > self.max_shapes:
                    _, (_, dropped) = self._kept.popitem(last=False)
                    self.nbytes -= dropped
        return table

    def __len__(self) -> int:
        return len(self._kept)

    def keys(self) -> list[tuple]:
        """(build function's name, key, device) of every table kept, least recently used first."""
        with self._lock:
            return [(build.__name__, key, device) for build, key, device in self._kept]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.nbytes = 0


# ---------------------------------------------------------------------- host caches of pure functions
SHAPE_CACHE_NODES = 256         # the largest shape a module-level host cache keeps (a drafted tree's size)
SHAPE_CACHE_SIZE = 256          # shapes each such cache keeps


def small_shape_cache(fn: Callable) -> Callable:
    """functools.lru_cache(SHAPE_CACHE_SIZE) for a pure host function of a parents tuple, used for
    shapes of at most SHAPE_CACHE_NODES nodes only; a longer one (a prefill's chain) is computed
    each time. Such a cache holds no tensors: at most 256 tuples of at most 256 small ints each
    (under 6 MiB in all; tests/test_tables.py measures it)."""
    cached = functools.lru_cache(maxsize=SHAPE_CACHE_SIZE)(fn)

    @functools.wraps(fn)
    def call(parents: tuple[int, ...]):
        return cached(parents) if len(parents) <= SHAPE_CACHE_NODES else fn(parents)

    call.cache_info, call.cache_clear = cached.cache_info, cached.cache_clear
    return call
