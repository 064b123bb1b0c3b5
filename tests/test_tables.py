"""Caches that belong to someone (issue 44, part 2): a tree shape's device tables are kept by the
verifier or drafter that uses them (specdec.tables.ShapeTables), bounded in bytes and freed with
their Speculator; a prefill's masks are arithmetic on the device and make no table; the module-level
host caches of pure shape functions keep small shapes only.

The bound the memory test holds: 30 Speculators created and dropped, over prompts of 30 different
lengths (single and batched generate), leave the process's resident memory within RSS_GROWTH of
what it was after a warm-up, and no table of any of them outlives it. (Before, every new prompt
length in a batch added an O(n^2) table to a module-level cache that no Speculator owned: the same
run grew by about 110 MiB.)"""
from __future__ import annotations

import gc
import os
import random
import tracemalloc
import weakref
from unittest import mock

import pytest
import torch

from conftest import noisy_copy, tiny_model
from specdec import Speculator
from specdec import tree as tree_module
from specdec.compiled import padded_parents
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tables import (SHAPE_CACHE_NODES, SHAPE_CACHE_SIZE, TABLE_BYTES, TABLE_SHAPES, ShapeTables, key_bytes,
                            tensor_bytes)
from specdec.tree import (chain_position_ids, chain_visibility, children_of, tree_position_ids, tree_shape,
                          tree_visibility)
from specdec.verifier import Verifier

TARGET = tiny_model("llama", seed=0, sharpen=4.0)
DRAFT = noisy_copy(TARGET, 0.3)
BRANCHING = [2, 2, 1]               # the draft tree: at most 2 + 4 + 4 nodes
MAX_ROWS = 1 + 2 + 4 + 4            # [pending] + the largest draft tree: the widest shape a table is made for
RSS_GROWTH = 32 * 2**20             # the stated bound on resident memory growth over 30 Speculators
HOST_CACHES_BYTES = 6 * 2**20       # the stated bound on the module-level host caches (specdec/tables.py)


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, 96, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------------- chains need no table
def reference_visibility(parents, prefix_len, window=None, capacity=None) -> torch.Tensor:
    """[N, K] who sees what, from the definition, one entry at a time on the host."""
    n = len(parents)
    width = prefix_len + n if capacity is None else capacity
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    position = list(range(width))
    for j in range(n):
        position[prefix_len + j] = prefix_len + depth[j]
    sees = torch.zeros(n, width, dtype=torch.bool)
    for i in range(n):
        ancestors, node = set(), i
        while node >= 0:
            ancestors.add(node)
            node = parents[node]
        for k in range(width):
            seen = k < prefix_len or (k - prefix_len < n and k - prefix_len in ancestors)
            if window is not None:
                seen = seen and position[k] > prefix_len + depth[i] - window
            sees[i, k] = seen
    return sees


CHAINS = [(1, 1), (1, 4), (3, 3), (3, 7), (6, 9), (9, 9)]     # (length, rows): a prefill chunk, padded
TREES = [(-1, 0, 0, 1, -1), (-1, -1, 1, 2), (-1, 0, 1, 1, 0)]


def depths_by_definition(parents) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


@pytest.mark.parametrize("parents", TREES + [padded_parents(tuple(range(-1, n - 1)), rows) for n, rows in CHAINS])
def test_tree_masks_and_positions_equal_the_definition(parents):
    """The table path (tree_visibility, tree_position_ids) against the definition, with windows,
    capacity and first_row."""
    for prefix_len in (0, 5):
        assert tree_position_ids(parents, prefix_len).tolist() == [[prefix_len + d for d in depths_by_definition(parents)]]
        for window in (None, 2, 4):
            for capacity in (None, prefix_len + len(parents) + 3):
                expected = reference_visibility(parents, prefix_len, window, capacity)
                for first_row in (0, len(parents) // 2):
                    got = tree_visibility(parents, prefix_len, window=window, capacity=capacity, first_row=first_row)
                    assert torch.equal(got, expected[first_row:]), (parents, prefix_len, window, capacity, first_row)


@pytest.mark.parametrize("length, rows", CHAINS)
def test_prefill_masks_and_positions_equal_the_definition(length, rows):
    """The prefill path (chain_visibility, chain_position_ids: computed, no table) gives what the
    definition gives for the padded chain it stands for."""
    parents = padded_parents(tuple(range(-1, length - 1)), rows)
    for prefix_len in (0, 5):
        assert chain_position_ids(length, rows, prefix_len).tolist() == \
            [[prefix_len + d for d in depths_by_definition(parents)]]
        for window in (None, 2, 4):
            for capacity in (None, prefix_len + rows + 3):
                got = chain_visibility(length, rows, prefix_len, window=window, capacity=capacity)
                assert torch.equal(got, reference_visibility(parents, prefix_len, window, capacity)), \
                    (length, rows, prefix_len, window, capacity)


def test_a_prefill_makes_no_table():
    """A batched prefill of prompts of different lengths (chunks shorter than the widest row) and a
    static-cache prefill never reach the host table builder, and leave no table behind."""
    built = []
    original = tree_module._host_shape_table

    def spy(parents):
        built.append(len(parents))
        return original(parents)

    with mock.patch.object(tree_module, "_host_shape_table", spy):
        sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=3, branching=BRANCHING, adaptive=False))
        sd.generate([prompt(40, 0), prompt(150, 1), prompt(77, 2)], max_new_tokens=6, ignore_eos=True)
        assert built and max(built) <= MAX_ROWS, built      # tree steps made tables; no prompt chunk did
        for tables in (sd.verifier.tables, sd.strategy.tables):    # the target's and the draft's (its catch-up)
            assert all(len(key) <= MAX_ROWS for _, key, _ in tables.keys())

        verifier = Verifier(TARGET, compile=True, prefill_chunk=50)
        verifier.static.buckets = ()           # the static cache and its masks, run eagerly (no compile time)
        built.clear()                          # (the attention layout's probe at load builds a 3-node tree)
        verifier.prefill(prompt(130, 3))
        assert built == [] and len(verifier.tables) == 0


# ---------------------------------------------------------------------- ShapeTables
def test_shape_tables_keep_a_bounded_lru():
    cpu = torch.device("cpu")
    builds = []

    def build(key, device):
        builds.append(key)
        return torch.zeros(key[0], dtype=torch.uint8, device=device)      # key[0] bytes

    def kept():
        return [key for _, key, _ in tables.keys()]

    def size(key):
        return key[0] + key_bytes(key)

    tables = ShapeTables(max_bytes=4 * size((200, 0)), max_shapes=3)
    first = tables.get(build, (200, 0), cpu)
    assert tables.get(build, (200, 0), cpu) is first and builds == [(200, 0)]     # kept: built once
    for key in [(200, 1), (200, 0), (200, 2), (200, 3)]:             # 0 used again; a fourth shape evicts 1
        tables.get(build, key, cpu)
    assert kept() == [(200, 0), (200, 2), (200, 3)]
    assert tables.nbytes == sum(size(key) for key in kept())
    tables.get(build, (700, 4), cpu)                                 # bytes evict too: 0 and 2 go
    assert kept() == [(200, 3), (700, 4)] and tables.nbytes == size((200, 3)) + size((700, 4))
    assert tables.nbytes <= tables.max_bytes
    huge = tables.get(build, (5000, 5), cpu)                         # larger than the budget: returned, not kept
    assert huge.numel() == 5000 and kept() == [(200, 3), (700, 4)]
    tables.get(build, (200, 1), cpu)                                 # evicted before: built again
    assert builds.count((200, 1)) == 2
    tables.clear()
    assert len(tables) == 0 and tables.nbytes == 0


def test_tensor_bytes_counts_a_shared_storage_once():
    shape = tree_shape((-1, 0, 0, 1), "cpu")          # depths and paths are views of one packed table
    table = shape.depths.untyped_storage().nbytes()
    assert tensor_bytes(shape) == table + shape.ancestors.untyped_storage().nbytes()


def test_tables_are_the_verifiers_and_shared_with_its_calls():
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=3, branching=BRANCHING, adaptive=False))
    sd.generate(prompt(30, 4), max_new_tokens=6, ignore_eos=True)
    kept = len(sd.verifier.tables)
    assert kept > 0                                            # the tree steps' shapes
    assert sd.verifier.for_call().tables is sd.verifier.tables
    sd.generate(prompt(30, 4), max_new_tokens=6, ignore_eos=True)
    assert len(sd.verifier.tables) == kept                     # the same shapes again: nothing new


# ---------------------------------------------------------------------- module-level host caches
def random_tree(nodes: int, seed: int) -> tuple[int, ...]:
    r = random.Random(seed)
    return tuple(-1 if i == 0 else r.randrange(-1, i) for i in range(nodes))


def test_host_shape_caches_stay_small():
    """children_of and _depths keep at most SHAPE_CACHE_SIZE shapes of at most SHAPE_CACHE_NODES nodes:
    filled past their size with the largest shapes they keep, they hold under HOST_CACHES_BYTES."""
    caches = (children_of, tree_module._depths)
    for cache in caches:
        cache.cache_clear()
    tracemalloc.start()
    try:
        shapes = [random_tree(SHAPE_CACHE_NODES, seed) for seed in range(SHAPE_CACHE_SIZE + 40)]
        for shape in shapes:
            for cache in caches:
                cache(shape)
        del shapes
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        sizes = [cache.cache_info().currsize for cache in caches]
    finally:
        tracemalloc.stop()
        for cache in caches:
            cache.cache_clear()
    assert sizes == [SHAPE_CACHE_SIZE] * len(caches)
    assert held <= HOST_CACHES_BYTES, f"{held / 2**20:.1f} MiB in the host shape caches"
    long_chain = tuple(range(-1, 4 * SHAPE_CACHE_NODES - 1))          # a prefill-sized shape: computed, not kept
    assert children_of(long_chain)[0] == (0,) and len(children_of(long_chain)) == len(long_chain) + 1
    assert children_of.cache_info().currsize == 0
    children_of.cache_clear()


# ---------------------------------------------------------------------- 30 Speculators
def run_one(i: int) -> list[weakref.ref]:
    """A Speculator over prompts of lengths no other i uses, single and batched; weak references to
    everything that kept tables."""
    strategy = DraftModel(DRAFT, num_tokens=3, branching=BRANCHING, adaptive=False) if i % 2 else PromptLookup()
    sd = Speculator(TARGET, None, strategy)
    sd.generate(prompt(20 + 13 * i, i), max_new_tokens=4, ignore_eos=True)
    sd.generate([prompt(30 + 11 * i, i + 100), prompt(100 + 7 * i, i + 200), prompt(45 + 3 * i, i + 300)],
                max_new_tokens=4, ignore_eos=True, temperature=0.0 if i % 3 else 0.8)
    owners = [sd.verifier.tables] + ([strategy.tables] if hasattr(strategy, "tables") else [])
    for tables in owners:
        assert tables.nbytes <= TABLE_BYTES and len(tables) <= TABLE_SHAPES
        assert all(len(key) <= MAX_ROWS for _, key, _ in tables.keys()), "a prefill chunk made a table"
    return [weakref.ref(tables) for tables in owners]


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_thirty_speculators_leave_memory_and_caches_bounded():
    for i in range(3):                              # warm-up: the allocator, lazy imports, first-call paths
        run_one(i)
    gc.collect()
    before = rss()
    dead: list[weakref.ref] = []
    for i in range(3, 33):
        dead += run_one(i)
        gc.collect()
        assert rss() - before <= RSS_GROWTH, f"resident memory grew {(rss() - before) / 2**20:.1f} MiB"
    assert all(ref() is None for ref in dead), "a dropped Speculator's tables are still alive"
    for cache in (children_of, tree_module._depths):
        assert cache.cache_info().currsize <= SHAPE_CACHE_SIZE
