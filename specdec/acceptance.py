"""Acceptance: which path of a CandidateTree the target keeps, and the token that follows it.

Pure functions of the tree, the target's per-node outputs and (when sampling) a random source.
Row 0 of the target outputs belongs to the pending token, row i + 1 to tree node i: row r holds
the target's distribution for the children of that row's node.

Both rules read the device back to the host once per step (greedy, coupled) or twice (rejection
sampling: every child's acceptance probability, computed on the device in a batch, with the step's
uniforms; then the final token's draw), so a GPU synchronises once or twice per step, whatever
the tree. The index tensors of a tree shape are built once per shape and device and kept in the
caller's ShapeTables (`tree_index`: the verifier's, through the Decoding).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .tables import ShapeTables
from .tree import WITHOUT_REPLACEMENT, CandidateTree, children_of, is_chain, to_device


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]   # tree node indices of the accepted path, root first
    next_token: int             # the target's own token after that path (correction or bonus)
    accepted_tokens: tuple[int, ...] | None = None   # tokens of the accepted nodes, root first
    #   (None: not carried, path_tokens reads them from the tree)
    next_token_on_device: torch.Tensor | None = field(default=None, compare=False, repr=False)
    #   [1] next_token where the target's tokens are (greedy, coupled): the next forward's pending
    #   input id, with no copy from the host (None: only on the host)

    def __post_init__(self):
        object.__setattr__(self, "next_token", int(self.next_token))

    @property
    def last_row(self) -> int:
        """Row of the target outputs that produced next_token (0 = pending token)."""
        return self.accepted[-1] + 1 if self.accepted else 0

    def path_tokens(self, tree: CandidateTree) -> list[int]:
        """Tokens of the accepted path, root first (no host read when the verdict carries them)."""
        if self.accepted_tokens is not None:
            return list(self.accepted_tokens)
        return tree.tokens[list(self.accepted)].tolist() if self.accepted else []


# ---------------------------------------------------------------------- per-shape index tensors
@dataclass(frozen=True)
class TreeIndex:
    """Index tensors of one tree shape on one device for the batched rejection tables, built once
    and reused every step."""
    kid_rows: torch.Tensor        # [P] long: the rows whose node has children, most children first
    kid_table: torch.Tensor       # [P, J] long: their children in drafted order, -1 past the last
    active: tuple[int, ...]       # [J]: how many of those rows have more than j children (a prefix)
    offsets: tuple[int, ...]      # [J]: where rank j's cells start when ranks are laid end to end
    slot_of_row: dict             # row -> its index in kid_rows (host)


def tree_index(parents: tuple[int, ...], device: torch.device, tables: ShapeTables | None = None) -> TreeIndex:
    """The TreeIndex of `parents` on `device`: kept in `tables` (built once per shape while they keep
    it), or built afresh without them."""
    if tables is None:
        return _build_tree_index(parents, device)
    return tables.get(_build_tree_index, parents, device)


def _build_tree_index(parents: tuple[int, ...], device: torch.device) -> TreeIndex:
    kids = children_of(parents)                       # kids[row] = children of row's node, drafted order
    kid_rows = sorted((row for row, siblings in enumerate(kids) if siblings), key=lambda row: -len(kids[row]))
    width = len(kids[kid_rows[0]]) if kid_rows else 0
    active = tuple(sum(len(kids[row]) > rank for row in kid_rows) for rank in range(width))
    if is_chain(parents):           # rows 0..N-1, one child each: built on the device, nothing copied
        rows = torch.arange(len(kid_rows), device=device)
        rows_on_device, table = rows, rows[:, None]
    else:                           # kid rows and the child table in one copy from the host
        table = [[row] + list(kids[row]) + [-1] * (width - len(kids[row])) for row in kid_rows]
        packed = to_device(torch.tensor(table, dtype=torch.long).reshape(len(kid_rows), 1 + width), device)
        rows_on_device, table = packed[:, 0], packed[:, 1:]
    return TreeIndex(kid_rows=rows_on_device, kid_table=table, active=active,
                     offsets=tuple(sum(active[:rank]) for rank in range(width)),
                     slot_of_row={row: slot for slot, row in enumerate(kid_rows)})


# ---------------------------------------------------------------------- greedy and coupled
def walk_values(tree: CandidateTree, target_tokens: torch.Tensor) -> torch.Tensor:
    """[N + 1 + N] what accept_greedy reads back: the tree's tokens, then the target's token per row
    (a batch concatenates every row's and reads them once)."""
    return torch.cat([tree.tokens.to(target_tokens.device), target_tokens])


def accept_greedy(tree: CandidateTree, target_tokens: torch.Tensor | list[int],
                  values: list[int] | None = None) -> Verdict:
    """Walk from the root to the first child equal to the target's token; the first miss yields
    the target's token there.

    target_tokens: [1 + N] the target's token of each row (its argmax, or the coupled sampler's
    noisy argmax), on the device. One host read: the tree's tokens and the target's come back
    together and the walk (O(N) Python) runs on the host. A GPU synchronises once either way, and
    the tokens have to reach the host for streaming and the stop rules; computing the path with
    tensor ops first would only add kernel launches (and time on a CPU: docs/architecture.md).
    values: walk_values(tree, target_tokens) already read (a batch reads all its rows' at once)."""
    target_tokens = torch.as_tensor(target_tokens, dtype=torch.long)             # [1 + N]
    if values is None:
        values = walk_values(tree, target_tokens).tolist()      # the step's one host read
    tokens, wanted = values[:tree.num_nodes], values[tree.num_nodes:]
    accepted: list[int] = []
    node = -1
    while True:
        want = wanted[node + 1]
        for child in tree.children(node):
            if tokens[child] == want:
                accepted.append(child)
                node = child
                break
        else:
            row = node + 1
            return Verdict(tuple(accepted), want, tuple(tokens[n] for n in accepted), target_tokens[row: row + 1])


# ---------------------------------------------------------------------- rejection sampling
def _normalized(residual: torch.Tensor) -> torch.Tensor | None:
    total = residual.sum()
    if not total > 0:
        return None
    return residual / total


def _rejected(residual: torch.Tensor, draft: torch.Tensor | None, token: torch.Tensor) -> torch.Tensor:
    """[..., V] residual after rejecting `token` [..., 1] drawn from draft [..., V] (None: a point
    mass on it): max(0, r - q), not renormalized."""
    if draft is None:
        return residual.scatter(-1, token, 0.0)
    return (residual - draft).clamp_(min=0)


def _draft_without(draft: torch.Tensor, tried: torch.Tensor) -> torch.Tensor:
    """[..., V] draft distribution with the earlier siblings' tokens (`tried`, bool [..., V])
    removed and renormalized: what a sibling drawn without replacement was drawn from."""
    draft = draft.masked_fill(tried, 0)
    return draft / draft.sum(dim=-1, keepdim=True)


def rejection_tables(tree: CandidateTree, target_probs: torch.Tensor, index: TreeIndex):
    """Every parent's rejection sampling over its children, batched over parents (the residual at
    a node depends only on its own target row and its children's drafts, not on the path to it).
    Rank j (the j-th child of each parent) is one batch over the parents that have one, a prefix
    of index.kid_rows: P_j = index.active[j] rows, N cells over all ranks.

    Returns, per rank j: accept_probs[j] [P_j] (child j of parent slot p is accepted with this
    probability when it is tried), residual_left[j] [P_j] bool (the residual after rejecting it
    is not all zero), and residuals[j + 1] [P_j, V] (the residual after the first j + 1 children
    were rejected; residuals[0] = the target rows [P, V]; meaningless after a zero residual)."""
    tokens = tree.tokens.to(target_probs.device)                                 # [N]
    draft_probs = None if tree.draft_probs is None else tree.draft_probs.to(target_probs.device)
    without_replacement = tree.siblings == WITHOUT_REPLACEMENT
    residual = target_probs[index.kid_rows]                                      # [P, V]
    residuals, accept_probs, residual_left = [residual], [], []
    tried = None                                                                 # [P_j, V] earlier siblings' tokens
    for rank, active in enumerate(index.active):
        residual = residual[:active]                                             # [P_j, V]
        child = index.kid_table[:active, rank]                                   # [P_j]
        token = tokens[child][:, None]                                           # [P_j, 1]
        if draft_probs is None:                                                  # point mass on `token`
            draft = None
            accept = residual.gather(1, token)                                   # [P_j, 1]
        else:
            draft = draft_probs[child]                                           # [P_j, V]
            if without_replacement and rank:
                draft = _draft_without(draft, tried[:active])
            accept = torch.clamp(residual.gather(1, token) / draft.gather(1, token), max=1.0)
        rejected = _rejected(residual, draft, token)                             # [P_j, V]
        total = rejected.sum(dim=-1, keepdim=True)                               # [P_j, 1]
        residual = rejected.div_(total)                                          # (a fresh tensor: in place)
        residuals.append(residual)
        accept_probs.append(accept[:, 0])
        residual_left.append(total[:, 0] > 0)
        if without_replacement and draft_probs is not None:
            tried = torch.zeros_like(residual, dtype=torch.bool) if tried is None else tried[:active]
            tried = tried.scatter(1, token, True)
    return accept_probs, residual_left, residuals


def _rest_on_host(tree: CandidateTree, kids: tuple[int, ...], rank: int, residual: torch.Tensor, rng,
                  next_uniform) -> tuple[int | None, torch.Tensor]:
    """kids[rank] was just rejected from `residual` [V] and left a zero residual max(0, r - q) (a
    rejection of probability zero, r == q): keep r, which has the same law and never divides by
    zero, and try the children after it one by one with host reads (a path of probability zero).
    Returns (accepted child or None, the residual then)."""
    device = residual.device
    tried = torch.zeros_like(residual, dtype=torch.bool)                          # [V]
    for position in range(rank, len(kids)):
        child = kids[position]
        token = tree.tokens[child: child + 1].to(device)                         # [1]
        draft = None if tree.draft_probs is None else tree.draft_probs[child].to(device)
        if draft is not None and tree.siblings == WITHOUT_REPLACEMENT and position:
            tried[tree.tokens[list(kids[:position])].to(device)] = True
            draft = _draft_without(draft, tried)
        if position > rank:                                                      # kids[rank] was rejected already
            accept_prob = residual[token] if draft is None else torch.clamp(residual[token] / draft[token], max=1.0)
            uniform = next_uniform()
            if rng.bernoulli(accept_prob) if uniform is None else rng.bernoulli(float(accept_prob), uniform):
                return child, residual
        renormalized = _normalized(_rejected(residual, draft, token))
        if renormalized is not None:
            residual = renormalized
    return None, residual


def accept_sampling(tree: CandidateTree, target_probs: torch.Tensor, rng,
                    tables: ShapeTables | None = None) -> Verdict:
    """Recursive rejection sampling over siblings; the kept path has the target's law.

    target_probs: [1 + N, V] fp32 warped target distributions per row.
    At each node keep a residual r = target distribution there; try the children in drafted
    order, accept child x with probability min(1, r(x) / q(x)); on rejection r <- norm(max(0, r - q)).
    q is the child's draft distribution (None: a point mass on x). Siblings drawn without
    replacement see q with the earlier siblings' tokens removed. If every child is rejected the
    token is drawn from r; below an accepted leaf it is drawn from the target there (bonus).

    Every child's acceptance probability is computed on the device first (rejection_tables);
    they come to the host in one read together with the tokens and the step's uniforms
    (`rng.uniforms`), the walk draws rng.bernoulli child by child in drafted order on the host,
    and the final draw (rng.draw, left on the device as the next pending input) is the second
    read. A zero residual (probability zero) finishes its node on the host (_rest_on_host).
    `tables`: where the tree shape's index is kept (None: built for this call alone)."""
    if tree.num_nodes == 0:
        drawn = rng.draw(target_probs[0])                                        # [1] on the device
        return Verdict((), int(drawn), (), drawn)                                 # the one read
    step = rejection_start(tree, target_probs, rng, tables)
    accepted, final, tokens = rejection_walk(step, rng, step.values.tolist())   # host read 1: tables, tokens, uniforms
    drawn = rng.draw(final)                                                      # [1] on the device
    return Verdict(tuple(accepted), int(drawn), tokens, drawn)                   # host read 2


@dataclass
class RejectionStep:
    """One tree's rejection sampling between its two reads: the device tables (rejection_tables) and
    `values`, what the host walk reads: acceptance probabilities, residual-left flags, the tree's
    tokens and the step's uniforms, as one flat float64 tensor (a batch reads every row's at once)."""
    tree: CandidateTree
    target_probs: torch.Tensor          # [1 + N, V]
    index: TreeIndex
    residuals: list
    values: torch.Tensor                # [M] float64, on the device


def rejection_start(tree: CandidateTree, target_probs: torch.Tensor, rng,
                    tables: ShapeTables | None = None) -> RejectionStep:
    """The device half of accept_sampling for a non-empty tree: every child's acceptance probability
    and the step's uniforms, packed for one read (the shape's index kept in `tables`)."""
    index = tree_index(tree.parents, target_probs.device, tables)
    accept_probs, residual_left, residuals = rejection_tables(tree, target_probs, index)
    uniforms = rng.uniforms(tree.num_nodes) if hasattr(rng, "uniforms") else None   # [N] or None
    parts = [*accept_probs, *residual_left, tree.tokens.to(target_probs.device)]
    if uniforms is not None:
        parts.append(uniforms.to(target_probs.device))
    return RejectionStep(tree, target_probs, index, residuals, torch.cat([part.double() for part in parts]))


def rejection_walk(step: RejectionStep, rng, values: list[float]) -> tuple[list[int], torch.Tensor, tuple[int, ...]]:
    """The host half: walk the tree with `values` (step.values read back), drawing rng.bernoulli child by
    child. Returns (accepted nodes, the distribution [V] the next token is drawn from, the accepted
    nodes' tokens)."""
    tree, target_probs, index, residuals = step.tree, step.target_probs, step.index, step.residuals
    cells = tree.num_nodes                                       # one acceptance cell per child
    tokens = [int(t) for t in values[2 * cells: 3 * cells]]
    uniform_values = iter(values[3 * cells:])

    def next_uniform():
        return next(uniform_values, None)

    accepted: list[int] = []
    node = -1
    while True:
        kids = tree.children(node)
        if not kids:                                              # bonus token below a leaf
            final = target_probs[node + 1]
            break
        slot = index.slot_of_row[node + 1]
        chosen, final = None, residuals[len(kids)][slot]
        for rank, child in enumerate(kids):
            uniform = next_uniform()
            accept_prob = values[index.offsets[rank] + slot]
            if rng.bernoulli(accept_prob) if uniform is None else rng.bernoulli(accept_prob, uniform):
                chosen = child
                break
            if not values[cells + index.offsets[rank] + slot]:     # a zero residual: the host finishes the node
                chosen, final = _rest_on_host(tree, kids, rank, residuals[rank][slot], rng, next_uniform)
                break
        if chosen is None:                                        # every child rejected
            break
        accepted.append(chosen)
        node = chosen
    return accepted, final, tuple(tokens[n] for n in accepted)
