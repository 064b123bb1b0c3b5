"""CandidateTree: the one thing a strategy hands to the verifier, and pure functions on trees.

A tree of N candidate tokens hangs below the *pending* token (the last committed token,
whose KV entry is not in the target's cache yet). Node i holds `tokens[i]`; `parents[i]` is
the index of its parent node, or -1 when its parent is the pending token. Parents always
come before children (parents[i] < i), so index order is a topological order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from .tables import ShapeTables, small_shape_cache

if TYPE_CHECKING:
    from .models import AttentionLayout

INDEPENDENT = "independent"
WITHOUT_REPLACEMENT = "without_replacement"
SIBLING_MODES = (INDEPENDENT, WITHOUT_REPLACEMENT)


_EMPTY_TREES: dict = {}      # device named in full (as given) -> CandidateTree.empty's tree


@dataclass(frozen=True)
class LowerRun:
    """The first `rows` rows of the forward over [pending] + tree (the pending token, then nodes 0 ..
    rows - 2 of a chain) already ran through the target's layers below a split, on the target's own
    cache: their KV there sits right after the prefix, their exit states are `states` [rows, H].
    `split` runs the rest: split.lower(ids [1, n], positions [1, n], cache) -> exit states [n, H] (the
    layers below, writing their KV), split.upper_logits(states [n, H], positions, cache) -> logits [n, V]
    (the layers above, writing theirs). early_exit's KV reuse hands it with its chain."""
    rows: int
    states: torch.Tensor
    split: object


@dataclass(frozen=True)
class CandidateTree:
    tokens: torch.Tensor                      # [N] long: candidate token of each node
    parents: tuple[int, ...]                  # [N]: parent node index, -1 = child of the pending token
    draft_probs: torch.Tensor | None = None   # [N, V] fp32: distribution node i's token was drawn from,
    #                                           None = deterministic proposals (point masses)
    siblings: str = INDEPENDENT               # how siblings were drawn from their shared distribution
    lower_run: LowerRun | None = field(default=None, repr=False, compare=False)   # rows whose lower layers ran
    #                                           already (None: the verifier runs the whole target on every row)
    _children: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self):
        parents = tuple(int(p) for p in self.parents)
        object.__setattr__(self, "parents", parents)
        if self.tokens.dim() != 1 or self.tokens.numel() != len(parents):
            raise ValueError(f"tokens must be [N] with N = len(parents) = {len(parents)}, got {tuple(self.tokens.shape)}")
        for i, p in enumerate(parents):
            if not -1 <= p < i:
                raise ValueError(f"parents[{i}] = {p}: a parent must come before its child (-1 <= parent < index)")
        if self.draft_probs is not None and (self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != len(parents)):
            raise ValueError(f"draft_probs must be [N, V] with N = {len(parents)}, got {tuple(self.draft_probs.shape)}")
        if self.siblings not in SIBLING_MODES:
            raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {self.siblings!r}")
        object.__setattr__(self, "_children", children_of(parents))

    # ------------------------------------------------------------------ builders
    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> "CandidateTree":
        """The tree of no nodes (a plain step), one per device named in full (the CPU, or an accelerator with its
        index): it holds nothing to change, and a step asks for it several times. A device named without its
        index ("cuda") means whichever is current, so its tree is made anew."""
        tree = _EMPTY_TREES.get(device)
        if tree is None:
            with torch.inference_mode(False):     # a normal tensor: usable inside and outside inference mode
                tree = cls(torch.empty(0, dtype=torch.long, device=device), ())
            named = None if device is None else torch.device(device)
            if named is not None and (named.type == "cpu" or named.index is not None):
                _EMPTY_TREES[device] = tree
        return tree

    @classmethod
    def chain(cls, tokens: Sequence[int] | torch.Tensor, draft_probs: torch.Tensor | None = None,
              device: torch.device | str | None = None) -> "CandidateTree":
        tokens = host_to_device(tokens, device)
        return cls(tokens, tuple(range(-1, tokens.numel() - 1)), draft_probs)

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]], device: torch.device | str = "cpu",
                   max_nodes: int | None = None) -> "CandidateTree":
        """Merge token paths into a trie (shared prefixes share nodes) of point-mass proposals.

        Paths are taken in order; a path is cut where the node budget runs out."""
        tokens, parents = merge_into_trie([], (), paths, max_nodes)
        return cls(host_to_device(tokens, device), tuple(parents))

    # ------------------------------------------------------------------ views
    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of `node` in drafted order; node -1 is the pending token."""
        return self._children[node + 1]

    def depths(self) -> list[int]:
        return depths_of(self.parents)

    def select(self, keep: Sequence[int]) -> "CandidateTree":
        """Sub-tree of the nodes `keep` (closed under parents, in index order). Keeping every node gives the
        tree itself (but for rows run ahead: a LowerRun is dropped by any select)."""
        if len(keep) == self.num_nodes and self.lower_run is None:
            return self
        new_index = {old: new for new, old in enumerate(keep)}
        parents = tuple(-1 if self.parents[o] == -1 else new_index[self.parents[o]] for o in keep)
        idx = host_to_device(list(keep), self.tokens.device)
        draft_probs = None if self.draft_probs is None else self.draft_probs[idx.to(self.draft_probs.device)]
        return CandidateTree(self.tokens[idx], parents, draft_probs, self.siblings)


# ---------------------------------------------------------------------- pure functions
@small_shape_cache
def children_of(parents: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """children[p + 1] = the children of node p (p = -1: of the pending token)."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return tuple(tuple(k) for k in kids)


def merge_into_trie(tokens: Sequence[int], parents: Sequence[int], paths: Sequence[Sequence[int]],
                    max_nodes: int | None = None) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree `tokens` / `parents` with the token `paths` merged in below the
    pending token: each path walks down from the root, reusing the child that holds its token and
    appending new nodes after the existing ones. The existing nodes keep their indices; paths are
    taken in order and one is cut where the tree would pass max_nodes nodes."""
    tokens, parents = [int(t) for t in tokens], list(parents)
    child_of = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}    # (parent, token) -> node
    for path in paths:
        parent = -1
        for token in path:
            token = int(token)
            node = child_of.get((parent, token))
            if node is None:
                if max_nodes is not None and len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                tokens.append(token)
                parents.append(parent)
                child_of[(parent, token)] = node
            parent = node
    return tokens, parents


@small_shape_cache
def _depths(parents: tuple[int, ...]) -> tuple[int, ...]:
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p == -1 else depth[p] + 1)
    return tuple(depth)


def depths_of(parents: Sequence[int]) -> list[int]:
    return list(_depths(tuple(parents)))


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def root_to_leaf_paths(parents: Sequence[int]) -> list[list[int]]:
    parents = tuple(parents)
    kids = children_of(parents)
    paths = []
    for leaf in range(len(parents)):
        if kids[leaf + 1]:
            continue
        path = [leaf]
        while parents[path[-1]] != -1:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def _ancestor_rows(parents: tuple[int, ...]) -> np.ndarray:
    """[N, N] bool on the host, row by row in numpy: a shape's tables are made on the host every step a
    drafter's tree takes a new shape, where a torch op per row costs a dispatch each."""
    n = len(parents)
    sees = np.eye(n, dtype=bool)                            # [N, N]: row i sees column j
    for i, p in enumerate(parents):
        if p >= 0:
            sees[i] |= sees[p]
    return sees


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """[N, N] bool: entry (i, j) is True when node j is node i or one of its ancestors."""
    return torch.from_numpy(_ancestor_rows(tuple(parents)))


@dataclass(frozen=True)
class TreeShape:
    """One tree shape's index tensors on one device, made once per shape and reused every step it
    recurs (Medusa's `generate_medusa_buffers`): what a forward over the shape and the commit of its
    accepted path need, so a step sends nothing from the host for a shape it has seen.
    `tree_shape(parents, device, tables)` builds them (a chain on the device itself, any other shape
    with one copy of a packed host table: pinned and non_blocking on CUDA, no device sync) and keeps
    them in `tables`, the ShapeTables of whoever asks (the verifier, a drafter)."""
    ancestors: torch.Tensor       # [N, N] bool: (i, j) = node j is node i or one of its ancestors
    depths: torch.Tensor          # [N] long: depth of each node (0 = a root)
    paths: torch.Tensor           # [N, D] long: row i = the nodes of node i's path, root first, then 0s

    def path(self, node: int, length: int) -> torch.Tensor:
        """[length] the first `length` nodes of node's path (length = its depth + 1: the whole path)."""
        return self.paths[node, :length]


def _host_shape_table(parents: tuple[int, ...]) -> torch.Tensor:
    """[N, N + 1 + D] long on the host: the ancestor matrix, the depths and the paths side by side
    (one tensor: one copy to the device)."""
    n = len(parents)
    depths = _depths(parents)
    width = max(depths, default=-1) + 1
    table = np.zeros((n, n + 1 + width), dtype=np.int64)
    table[:, :n] = _ancestor_rows(parents)
    table[:, n] = depths
    for node in range(n):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        table[node, n + 1: n + 1 + len(path)] = path[::-1]
    return torch.from_numpy(table)


def host_to_device(values, device: torch.device | str | None, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (host data: a list of ints, say, or a tensor) as a `dtype` tensor on `device` (None:
    where a tensor already is, else the host), copied without stalling the device (`to_device`):
    `torch.tensor(values, device="cuda")` copies from pageable memory, a sync."""
    if isinstance(values, torch.Tensor):
        tensor = values.to(dtype)
        if device is None or tensor.device == torch.device(device):
            return tensor
        return to_device(tensor, device) if tensor.device.type == "cpu" else tensor.to(device)
    if device is not None and torch.device(device).type == "cuda":
        return to_device(torch.tensor(values, dtype=dtype), device)
    return torch.tensor(values, dtype=dtype, device=device)    # elsewhere made in place: nothing to stall


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host data onto `device` the way that does not stall it: through pinned memory with
    non_blocking=True on CUDA (an asynchronous copy; pageable memory would make the host wait);
    elsewhere a plain move."""
    device = torch.device(device)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _build_tree_shape(parents: tuple[int, ...], device: torch.device) -> TreeShape:
    n = len(parents)
    if is_chain(parents):           # a chain: built on the device, nothing copied
        rows = torch.arange(n, device=device)
        ancestors = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
        return TreeShape(ancestors, rows, torch.where(ancestors, rows[None, :], 0))
    table = to_device(_host_shape_table(parents), device)                     # [N, N + 1 + D]
    return TreeShape(table[:, :n].bool(), table[:, n], table[:, n + 1:])


def tree_shape(parents: Sequence[int], device: torch.device | str, tables: ShapeTables | None = None) -> TreeShape:
    """The TreeShape of `parents` on `device`: kept in `tables` (built once per shape and device while
    they keep it), or built afresh without them."""
    parents, device = tuple(parents), torch.device(device)
    if tables is None:
        return _build_tree_shape(parents, device)
    return tables.get(_build_tree_shape, parents, device)


def tree_visibility(parents: Sequence[int], prefix_len: int, device: torch.device | str = "cpu",
                    window: int | None = None, capacity: int | None = None, first_row: int = 0,
                    tables: ShapeTables | None = None) -> torch.Tensor:
    """[N - first_row, K] bool, the ancestor mask every tree forward uses (the verifier's, the compiled
    one's, the drafters'): entry (i, k) is True when tree node first_row + i, written after
    prefix_len committed entries, sees key k. Every node sees the whole prefix, its ancestors and
    itself. K = prefix_len + N, or `capacity` for a fixed-size cache (the slots after the tree,
    stale or empty, are hidden). With a sliding `window` (Hugging Face's rule: a query at position
    q sees keys at positions k > q - window; a prefix slot's position is its index, a node's
    prefix_len + depth) a node sees only the keys of its own path within the window. `first_row`:
    the rows of the nodes before it are already in the cache (a drafter feeding a tree level by
    level) and get no row. The ancestors come from the shape's TreeShape, kept in `tables`."""
    n = len(parents)
    width = prefix_len + n if capacity is None else capacity
    ancestors = tree_shape(parents, device, tables).ancestors                           # [N, N], kept per shape
    sees = torch.zeros(n, width, dtype=torch.bool, device=device)                      # [N, K]
    sees[:, :prefix_len] = True
    sees[:, prefix_len: prefix_len + n] = ancestors
    if window is not None:
        query_positions = tree_position_ids(parents, prefix_len, device, tables)[0]   # [N]
        key_positions = torch.arange(width, device=device)                             # [K]
        key_positions[prefix_len: prefix_len + n] = query_positions
        sees &= key_positions[None, :] > query_positions[:, None] - window
    return sees[first_row:]


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, K] bool visibility -> [1, 1, R, K] additive mask of `dtype` (0 = seen, dtype's min = hidden),
    the form Hugging Face models take."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def tree_attention_mask(parents: Sequence[int], prefix_len: int, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu", window: int | None = None,
                        capacity: int | None = None, first_row: int = 0,
                        tables: ShapeTables | None = None) -> torch.Tensor:
    """Additive 4-D mask [1, 1, N - first_row, K] of a forward over the tree nodes on top of a cache
    of prefix_len tokens (tree_visibility says who sees what)."""
    return additive_mask(tree_visibility(parents, prefix_len, device, window, capacity, first_row, tables), dtype)


def _by_layout(layout: AttentionLayout | None, mask_for_window):
    """One mask when every layer attends alike (mask_for_window(None) without a layout), else {layer
    type: mask} (Hugging Face's per-type mask mapping), each layer type with its own sliding window."""
    if layout is None:
        return mask_for_window(None)
    by_window = {window: mask_for_window(window) for window in set(layout.windows.values())}
    if not layout.by_type:
        return next(iter(by_window.values()))
    return {layer_type: by_window[window] for layer_type, window in layout.windows.items()}


def tree_masks(layout: AttentionLayout | None, parents: Sequence[int], prefix_len: int, dtype: torch.dtype,
               device: torch.device | str, capacity: int | None = None, first_row: int = 0,
               tables: ShapeTables | None = None):
    """The attention mask(s) of a tree forward for a model whose layers attend as `layout` says: one
    mask (tree_attention_mask) when every layer attends alike, else {layer type: mask} (Hugging
    Face's per-type mask mapping), each layer type with its own sliding window. layout None: one
    plain mask, no window. `tables`: the caller's ShapeTables, where the shape's table is kept."""
    return _by_layout(layout, lambda window: tree_attention_mask(parents, prefix_len, dtype, device, window,
                                                                 capacity, first_row, tables))


def tree_position_ids(parents: Sequence[int], prefix_len: int, device: torch.device | str = "cpu",
                      tables: ShapeTables | None = None) -> torch.Tensor:
    """[1, N] position ids: prefix_len + depth of each node (from the shape's depths kept in `tables`:
    no copy once kept)."""
    return (tree_shape(parents, device, tables).depths + prefix_len)[None]


# ---------------------------------------------------------------------- prefill chunks: no table
# A prefill chunk is a chain of `length` rows (padded in a batch or a compiled bucket to `rows`, each
# padding row hanging off row 0 as compiled.padded_parents does). Its mask and positions are
# arithmetic, built on the device from aranges: no per-shape table, no host copy, nothing kept, so a
# new prompt length costs nothing after its forward.
def _chain_depths(length: int, rows: int, device: torch.device | str) -> torch.Tensor:
    """[R] depth of each row: row i < length at depth i, a padding row (a child of row 0) at depth 1."""
    depths = torch.arange(rows, device=device)
    depths[length:] = 1
    return depths


def chain_visibility(length: int, rows: int, prefix_len: int, device: torch.device | str = "cpu",
                     window: int | None = None, capacity: int | None = None) -> torch.Tensor:
    """[R, K] bool: what tree_visibility gives for padded_parents(chain of `length` rows, `rows`),
    computed: row i < length sees the slots up to prefix_len + i, a padding row the prefix, row 0
    and itself; windows as tree_visibility's."""
    width = prefix_len + rows if capacity is None else capacity
    key = torch.arange(width, device=device)                                            # [K]
    own = torch.arange(prefix_len, prefix_len + rows, device=device)                    # [R]: each row's own slot
    sees = key[None, :] <= own[:, None]                                                 # [R, K]
    if length < rows:                            # a padding row sees the prefix, row 0 and itself
        sees[length:] = (key[None, :] <= prefix_len) | (key[None, :] == own[length:, None])
    if window is not None:
        query_positions = _chain_depths(length, rows, device) + prefix_len              # [R]
        key_positions = key.clone()
        key_positions[prefix_len: prefix_len + rows] = query_positions
        sees &= key_positions[None, :] > query_positions[:, None] - window
    return sees


def chain_masks(layout: AttentionLayout | None, length: int, rows: int, prefix_len: int, dtype: torch.dtype,
                device: torch.device | str, capacity: int | None = None):
    """tree_masks of a prefill chunk (a chain of `length` rows padded to `rows`), with no table."""
    return _by_layout(layout, lambda window: additive_mask(
        chain_visibility(length, rows, prefix_len, device, window, capacity), dtype))


def chain_position_ids(length: int, rows: int, prefix_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, R] tree_position_ids of a prefill chunk (a chain of `length` rows padded to `rows`), with no table."""
    return (_chain_depths(length, rows, device) + prefix_len)[None]


def with_pending_root(parents: Sequence[int]) -> tuple[int, ...]:
    """The parents of the verifier's input [pending token] + tree: the pending token becomes node 0."""
    return (-1,) + tuple(p + 1 for p in parents)
