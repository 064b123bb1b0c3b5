"""prompt_lookup: guess the next tokens by finding the current suffix earlier in the context.

When the last n tokens (prompt + generated, ending with the pending token) already occurred
earlier, the tokens that followed them there are a cheap guess. Longer n-grams are tried first
(min_ngram <= n <= max_ngram); up to `max_matches` distinct continuations, most recent first,
are merged into one trie of point-mass proposals that the tree verifier checks in one forward.

Matching costs O(1) per step whatever the context length: an n-gram -> end positions index is
kept up to date incrementally (each committed token is indexed once, in reset or observe), and
a lookup walks only the few most recent occurrences of the suffix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterator, Sequence

from specdec.config import setting
from specdec.errors import ConfigError
from specdec.models import verified_on_chains
from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy

@dataclass
class PromptLookupConfig:
    """The `prompt_lookup:` section. Defaults chosen on CPU, where each tree node costs forward
    time: unigram matches (weak guesses) are off and the trie is small (benchmarks/pld_check.py;
    benchmarks/results/defaults.md says what it measured)."""
    min_ngram: int = setting(2, min=1)      # shortest suffix n-gram to look up
    max_ngram: int = setting(3, min=1)      # longest suffix n-gram to look up (tried first)
    num_tokens: int = setting(10, min=1)    # tokens taken after each match
    max_matches: int = setting(4, min=1)    # distinct continuations merged into the trie (most recent first)
    max_nodes: int = setting(16, min=1)     # trie node budget


CONFIG_SECTIONS = {"prompt_lookup": PromptLookupConfig}


# How many occurrences of one n-gram a lookup reads (most recent first) before giving up on
# finding more distinct continuations; keeps a lookup cheap when a short n-gram is everywhere.
SCAN_PER_MATCH = 8


class NgramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a growing context ends, newest first.

    Per n: `last_end` maps an n-gram to the last position where it ends, and `prev_end[pos]`
    holds the previous end of the n-gram that ends at pos (-1: none), so the occurrences form a
    linked list through the positions. An n-gram is packed into one int (32 bits per token):
    indexing a token allocates no container, which keeps it cheap and out of the garbage
    collector's way on long contexts."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.clear()

    def clear(self) -> None:
        sizes = range(self.min_n, self.max_n + 1)
        self.last_end: dict[int, dict[int, int]] = {n: {} for n in sizes}   # n -> {packed n-gram: end}
        self.prev_end: dict[int, list[int]] = {n: [] for n in sizes}        # n -> [context length]
        self.indexed = 0              # tokens of the context already indexed

    def extend(self, token_ids: Sequence[int]) -> None:
        """Index the n-grams ending at the positions not seen yet (the context only grows)."""
        if len(token_ids) < self.indexed:    # a different, shorter context: start over
            self.clear()
        for end in range(self.indexed, len(token_ids)):
            key = 0
            for n in range(1, self.max_n + 1):
                if n <= end + 1:
                    key |= int(token_ids[end - n + 1]) << (32 * (n - 1))
                if n < self.min_n:
                    continue
                if n > end + 1:                        # too close to the start for an n-gram
                    self.prev_end[n].append(-1)
                    continue
                last = self.last_end[n]
                self.prev_end[n].append(last.get(key, -1))
                last[key] = end
        self.indexed = len(token_ids)

    def suffix_occurrences(self, token_ids: Sequence[int], n: int) -> Iterator[int]:
        """End positions of the context's last n tokens, newest first (the suffix itself first)."""
        if n > len(token_ids):
            return
        key = 0
        for j in range(n):
            key |= int(token_ids[len(token_ids) - 1 - j]) << (32 * j)
        end = self.last_end[n].get(key, -1)
        prev = self.prev_end[n]
        while end >= 0:
            yield end
            end = prev[end]


def cut_after_eos(tokens: list[int], eos_token_ids: Collection[int]) -> list[int]:
    """Keep tokens up to and including the first EOS: nothing is proposed past an EOS."""
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: i + 1]
    return tokens


def add_continuation(found: list[list[int]], candidate: list[int]) -> bool:
    """Add `candidate` to the distinct continuations `found` (in place); False if it adds nothing.

    A candidate that is a prefix of one already found is a duplicate (it adds no trie node);
    one that extends a found continuation replaces it, keeping its rank."""
    for i, path in enumerate(found):
        shared = min(len(path), len(candidate))
        if path[:shared] == candidate[:shared]:
            if len(candidate) > len(path):
                found[i] = candidate
            return False
    found.append(candidate)
    return True


class PromptLookup(BaseStrategy):
    name = "prompt_lookup"
    needs_hidden_states = False
    match_length = None     # (LookupPart) its nodes are not told apart by the length of the match

    # defaults: PromptLookupConfig's, the one source of them
    def __init__(self, *, min_ngram: int = PromptLookupConfig.min_ngram, max_ngram: int = PromptLookupConfig.max_ngram,
                 num_tokens: int = PromptLookupConfig.num_tokens, max_matches: int = PromptLookupConfig.max_matches,
                 max_nodes: int = PromptLookupConfig.max_nodes):
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(f"prompt_lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, "
                              f"max_ngram={max_ngram}")
        for key, value in (("num_tokens", num_tokens), ("max_matches", max_matches), ("max_nodes", max_nodes)):
            if value < 1:
                raise ConfigError(f"prompt_lookup.{key} must be >= 1, got {value}")
        self.min_ngram, self.max_ngram = int(min_ngram), int(max_ngram)
        self.num_tokens = int(num_tokens)
        self.max_matches = int(max_matches)
        self.max_nodes = int(max_nodes)
        self.index = NgramIndex(self.min_ngram, self.max_ngram)
        self.device = "cpu"
        self.chains = False           # the target is verified on chains (linear-attention layers)

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        self.device = target.device
        self.chains = verified_on_chains(target)

    def reset(self, state: DecodeState) -> None:
        self.index = NgramIndex(self.min_ngram, self.max_ngram)   # a new one: a call's copy must not share it
        self.index.extend(state.token_ids)

    def propose(self, state: DecodeState) -> CandidateTree:
        paths = self.propose_paths(state)
        if not paths:
            return CandidateTree.empty(self.device)
        if self.chains:               # a target verified on chains: the most recent continuation alone
            paths = paths[:1]
        return CandidateTree.from_paths(paths, device=self.device, max_nodes=self.max_nodes)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.catch_up(state.token_ids)

    # ------------------------------------------------------------------ for a strategy that merges lookup in (auto)
    def catch_up(self, token_ids: Sequence[int]) -> None:
        """Index the committed tokens not indexed yet (those from the last step on; a no-op when
        nothing new was committed)."""
        self.index.extend(token_ids)

    def propose_paths(self, state: DecodeState) -> list[list[int]]:
        """The token paths propose() merges into its trie (at most max_nodes nodes): the suffix
        matches' continuations, no deeper than state.max_depth; [] for none."""
        depth = min(self.num_tokens, state.max_depth)
        if depth <= 0:
            return []
        self.catch_up(state.token_ids)
        return self.continuations(state.token_ids, depth, state.eos_token_ids)

    # ------------------------------------------------------------------ matching
    def continuations(self, token_ids: Sequence[int], depth: int,
                      eos_token_ids: Collection[int] = ()) -> list[list[int]]:
        """Up to max_matches distinct continuations (each <= depth tokens) of the context's
        suffix n-grams: longest n first, most recent occurrence first within one n."""
        length = len(token_ids)
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, length), self.min_ngram - 1, -1):
            scanned = 0
            for end in self.index.suffix_occurrences(token_ids, n):
                if end >= length - 1:                 # the suffix itself: nothing follows it yet
                    continue
                scanned += 1
                if scanned > SCAN_PER_MATCH * self.max_matches:
                    break
                candidate = cut_after_eos(list(token_ids[end + 1: end + 1 + depth]), eos_token_ids)
                if add_continuation(found, candidate) and len(found) == self.max_matches:
                    return found
        return found


def from_config(cfg, target, tokenizer, device, dtype) -> PromptLookup:
    c = cfg.prompt_lookup
    return PromptLookup(min_ngram=c.min_ngram, max_ngram=c.max_ngram, num_tokens=c.num_tokens,
                        max_matches=c.max_matches, max_nodes=c.max_nodes)
