"""lookahead: Jacobi iteration and an n-gram pool in one tree, with no training (Fu et al., ICML 2024,
"Break the Sequential Dependency of LLM Inference Using Lookahead Decoding").

Two branches ride in every verify forward:

* The lookahead branch, a Jacobi window of W columns x (N - 1) levels of guessed tokens. Cell (l, i)
  guesses the token at position base + l + i, where base is the pending token's position; cell
  (0, 0) IS the pending token (as in llama.cpp's and the authors' code), so the branch adds
  W(N - 1) - 1 rows. In the paper's mask a cell sees the committed context, the first level's cells
  left of it and its own, and its own column from the second level down to itself: (0, 0..i), then
  (1, i) .. (l, i).
  That set is a path. Its positions run base .. base + l + i with no gap, so the cell is exactly a
  tree node whose ancestors are that path: the first level is a chain below the pending token, and
  each column hangs below its first-level cell as a chain of N - 2 nodes. Our tree mask is then the
  paper's mask, with no approximation, and our positions (prefix + depth) are the paper's.
* The verification branch: the pool's n-grams (at most G, the latest kept) whose first token is the
  pending token, their other N - 1 tokens as paths below it.

Both branches are merged into one trie (specdec.tree.merge_into_trie, as prompt lookup merges its
matches: a path reuses the node that already holds its token below the same parent). A shared node
has one path, so one set of logits: merging changes no cell's attention nor position, and only drops
duplicate rows.

The verifier walks the tree as it walks any tree, so a lookahead node that the target agrees with is
accepted like any other node, and one it does not agree with is not: the committed text is the
target's whatever the window or the pool hold. Proposals are point masses, lossless under every
sampler.

After the forward, the target's argmax at each last-level cell (StepResult.top_ids, asked for with
top_k_ids = 1) is the new guess one position further along its diagonal: the window's new last
level. Each column that the target read whole gives the pool an n-gram: its cells (0, i) .. (N-2, i)
then the argmax after them, N tokens at consecutive positions, keyed by the first. A column holding
a guess that no forward produced (the random start, a refill) gives none.

When s tokens are committed, base moves s positions. The window moves with it so that every cell
keeps guessing the position it guessed (the authors' code with ALWAYS_FWD_ONE off): with the
target's new guesses, the levels move up one (the first drops, the new one comes last) and the
columns s - 1 to the left; without them (a step this strategy did not draft, inside auto), the
columns move s to the left. Cells left empty on the right are refilled with a token drawn from the
context, as the window starts (the paper's random start from the prompt), by a random source of the
call's own (never the call's sampling one).

`pool_from_context` also puts every n-gram of the context into the pool (TensorRT-LLM fills its pool
from the prompt; the authors' POOL_FROM_PROMPT), prompt lookup's guesses folded into the pool.

Cost: (W + G)(N - 1) rows per forward at most (the pending token's included), whatever is accepted:
on a device where extra rows are not free the window can cost more than it brings (docs/strategies.md).
"""
from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from specdec.config import setting
from specdec.errors import ConfigError
from specdec.tree import CandidateTree, host_to_device, merge_into_trie
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy

DEFAULT_WINDOW, DEFAULT_NGRAM, DEFAULT_GUESSES = 5, 4, 5     # the paper's small example (its W = 5, N = 4), G = W

# (our key, TensorRT-LLM's key, default, least valid value)
SIZES = (("window", "max_window_size", DEFAULT_WINDOW, 1),
         ("ngram", "max_ngram_size", DEFAULT_NGRAM, 2),
         ("guesses", "max_verification_set_size", DEFAULT_GUESSES, 1))


@dataclass
class LookaheadConfig:
    """The `lookahead:` section: the Jacobi window and the n-gram pool (strategies/lookahead.py). Each
    size has two names, ours and TensorRT-LLM's; set either (both: they must agree). Unset: the default."""
    window: Optional[int] = setting(None, min=1)        # W, the window's columns (default 5)
    ngram: Optional[int] = setting(None, min=2)         # N, the n-gram size; the window has N - 1 levels (default 4)
    guesses: Optional[int] = setting(None, min=1)       # G, n-grams kept (and verified) per first token (default 5)
    max_window_size: Optional[int] = setting(None, min=1)            # TensorRT-LLM's name for window
    max_ngram_size: Optional[int] = setting(None, min=2)             # TensorRT-LLM's name for ngram
    max_verification_set_size: Optional[int] = setting(None, min=1)  # TensorRT-LLM's name for guesses
    pool_from_context: bool = False     # also pool every n-gram of the context (prompt and output)


CONFIG_SECTIONS = {"lookahead": LookaheadConfig}


def resolve_sizes(section) -> dict[str, int]:
    """{window, ngram, guesses} from a `lookahead:` section: each from whichever of its two names is set,
    else its default; a ConfigError when both names are set to different values."""
    sizes = {}
    for ours, theirs, default, _ in SIZES:
        mine, other = section[ours], section[theirs]
        if mine is not None and other is not None and int(mine) != int(other):
            raise ConfigError(f"lookahead.{ours} = {mine} and lookahead.{theirs} = {other} disagree: they are two "
                              f"names of one setting (ours and TensorRT-LLM's); set one of them")
        sizes[ours] = int(next((v for v in (mine, other) if v is not None), default))
    return sizes


# ---------------------------------------------------------------------- the n-gram pool
class NgramPool:
    """At most `size` n-grams per first token, the latest kept (a repeated n-gram counts as new)."""

    def __init__(self, size: int):
        self.size = size
        self.by_first: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, first: int, rest: Sequence[int]) -> None:
        kept = self.by_first.setdefault(int(first), OrderedDict())
        key = tuple(int(t) for t in rest)
        kept[key] = None
        kept.move_to_end(key)
        if len(kept) > self.size:
            kept.popitem(last=False)

    def add_ngrams_of(self, tokens: Sequence[int], n: int, first_end: int = 0) -> None:
        """Every n-gram of `tokens` that ends at index first_end or later."""
        for end in range(max(first_end, n - 1), len(tokens)):
            self.add(tokens[end - n + 1], tokens[end - n + 2: end + 1])

    def guesses(self, first: int) -> list[tuple[int, ...]]:
        """The n-grams (less their first token) that start with `first`, latest first."""
        return list(reversed(self.by_first.get(int(first), ())))


# ---------------------------------------------------------------------- the Jacobi window
class Window:
    """W columns x L = N - 1 levels of guesses: tokens[l][i] guesses position base + l + i (base: the
    pending token's); tokens[0][0] stands for the pending token and is never drafted. learned[l][i]:
    whether the guess is the target's (a forward's argmax), not a refill."""

    def __init__(self, width: int, levels: int, fill: Callable[[], int]):
        self.width, self.levels = width, levels
        self.tokens = [[fill() for _ in range(width)] for _ in range(levels)]
        self.learned = [[False] * width for _ in range(levels)]

    def column_path(self, i: int) -> list[int]:
        """The tokens from the pending token down to cell (L - 1, i): (0, 1..i), then (1..L-1, i); cell
        (l, i) is entry i + l - 1 (its tree depth)."""
        return self.tokens[0][1: i + 1] + [self.tokens[level][i] for level in range(1, self.levels)]

    def ngrams(self, pending: int, outputs: Sequence[int | None]) -> list[tuple[int, tuple[int, ...]]]:
        """(first token, the other N - 1) of every column the target read whole: its cells top to
        bottom (the pending token for (0, 0)), then the target's argmax after its last cell."""
        found = []
        for i, out in enumerate(outputs):
            cells = [(level, i) for level in range(self.levels) if (level, i) != (0, 0)]
            if out is None or not all(self.learned[level][col] for level, col in cells):
                continue
            first = pending if i == 0 else self.tokens[0][i]
            found.append((first, tuple(self.tokens[level][i] for level in range(1, self.levels)) + (out,)))
        return found

    def advance(self, committed: int, outputs: Sequence[int | None] | None, fill: Callable[[], int]) -> None:
        """Base moves `committed` positions; each cell keeps guessing its own position. outputs: the
        target's argmax after each last-level cell (None where not read), or None when the step read none."""
        if outputs is not None:
            self.tokens = self.tokens[1:] + [[fill() if t is None else int(t) for t in outputs]]
            self.learned = self.learned[1:] + [[t is not None for t in outputs]]
            shift = committed - 1
        else:
            shift = committed
        for level in range(self.levels):
            kept = self.width - min(shift, self.width)
            self.tokens[level] = self.tokens[level][shift:][:kept] + [fill() for _ in range(self.width - kept)]
            self.learned[level] = self.learned[level][shift:][:kept] + [False] * (self.width - kept)


# ---------------------------------------------------------------------- the strategy
@dataclass(frozen=True)
class Drafted:
    """One proposal, for observe: the tree, the forward's row of each column's last-level cell (0: the
    pending token's row, for N = 2 and column 0; None: cut by the depth budget), and the nodes on the
    verification branch's paths (a node the window shares with them among them)."""
    tree: CandidateTree
    last_rows: tuple[int | None, ...]
    guess_nodes: frozenset[int] = frozenset()


def draft(window: Window, guesses: Sequence[Sequence[int]], max_depth: int
          ) -> tuple[list[int], list[int], list, frozenset[int]]:
    """(tokens, parents, row of each column's last-level cell, nodes on the guesses' paths) of the merged
    tree: the window's columns, then the guesses, each path cut at max_depth levels."""
    whole = [window.column_path(i) for i in range(window.width)]
    columns = [path[:max_depth] for path in whole]
    verified = [list(g)[:max_depth] for g in guesses]
    tokens, parents = merge_into_trie([], (), columns + verified)
    child = {(p, t): node for node, (p, t) in enumerate(zip(parents, tokens))}

    def nodes_of(path: Sequence[int]) -> list[int]:
        nodes = [-1]
        for token in path:
            nodes.append(child[(nodes[-1], token)])
        return nodes[1:]
    last_rows: list[int | None] = []
    for path, full in zip(columns, whole):
        last = ([-1] + nodes_of(path))[-1]       # the last-level cell: the path's end (-1: the pending token)
        last_rows.append(last + 1 if len(path) == len(full) else None)   # a path cut shorter lost it
    return tokens, parents, last_rows, frozenset(node for path in verified for node in nodes_of(path))


class Lookahead(BaseStrategy):
    name = "lookahead"
    needs_hidden_states = False
    top_k_ids = 1                 # the target's argmax at every row: the window's next guesses
    verify_whole = True           # inside auto: a window cut by the planner would stop learning

    def __init__(self, window: int = DEFAULT_WINDOW, ngram: int = DEFAULT_NGRAM, guesses: int = DEFAULT_GUESSES, *,
                 pool_from_context: bool = False):
        for (key, theirs, _, low), value in zip(SIZES, (window, ngram, guesses)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"lookahead.{key} (TensorRT-LLM's {theirs}) must be an integer >= {low}, got "
                                  f"{value!r}" + ("; an n-gram of one token guesses nothing" if key == "ngram" else ""))
        self.window_size, self.ngram, self.guesses = window, ngram, guesses
        self.pool_from_context = bool(pool_from_context)
        self.max_nodes = (window + guesses) * (ngram - 1) - 1     # the pending token is the window's first cell
        self.device = "cpu"
        self.reset_call([0])

    def reset_call(self, context: Sequence[int]) -> None:
        """Per-call state (fresh objects: a call's copy shares none of it)."""
        self.context = context
        self.random = random.Random(0)        # the refills' source: fixed, so a call's drafts repeat exactly
        self.window = Window(self.window_size, self.ngram - 1, self.refill)
        self.pool = NgramPool(self.guesses)
        self.drafted: Drafted | None = None

    def refill(self) -> int:
        return self.context[self.random.randrange(len(self.context))]

    def bind(self, target, tokenizer) -> None:
        self.device = target.device

    def reset(self, state: DecodeState) -> None:
        self.reset_call(state.token_ids)
        if self.pool_from_context:
            self.pool.add_ngrams_of(state.token_ids, self.ngram)

    def propose(self, state: DecodeState) -> CandidateTree:
        pending = state.token_ids[-1]
        depth = max(state.max_depth, 0)
        tokens, parents, last_rows, guess_nodes = draft(self.window, self.pool.guesses(pending), depth)
        tree = CandidateTree(host_to_device(tokens, self.device), tuple(parents)) if tokens else \
            CandidateTree.empty(self.device)
        self.drafted = Drafted(tree, tuple(last_rows), guess_nodes)
        return tree

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.context = state.token_ids
        outputs = None
        drafted, self.drafted = self.drafted, None
        # the rows of exactly this tree's forward (a strategy around this one may verify fewer: then none)
        if (drafted is not None and result.tree is drafted.tree and result.top_ids is not None
                and result.top_ids.shape[0] == 1 + drafted.tree.num_nodes):
            argmax = result.top_ids[:, 0].tolist()                  # [1 + N]: the step's one read
            outputs = [None if row is None or row >= len(argmax) else argmax[row] for row in drafted.last_rows]
            pending = state.token_ids[result.committed_before - 1]
            for first, rest in self.window.ngrams(pending, outputs):
                self.pool.add(first, rest)
        self.window.advance(result.num_accepted + 1, outputs, self.refill)
        if self.pool_from_context:
            self.pool.add_ngrams_of(state.token_ids, self.ngram, first_end=result.committed_before)


def from_config(cfg, target, tokenizer, device, dtype) -> Lookahead:
    return Lookahead(**resolve_sizes(cfg.lookahead), pool_from_context=cfg.lookahead.pool_from_context)
