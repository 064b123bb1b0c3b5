"""suffix: SuffixDecoding (Oliaro et al., NeurIPS 2025) — draft the most frequent continuations of
the longest matching suffix, over earlier outputs and over the current prompt and output.

Two kinds of suffix trees (strategies.suffix_tree.SuffixTree) are searched every step:
* the call's own tree over prompt + output, built in reset() and extended by the accepted tokens
  in observe() (O(max_depth) per new token);
* the global cache (SuffixCache): the outputs of this Speculator's earlier calls, one tree per
  cache scope, bounded by max_cached_tokens (oldest outputs evicted first), plus an optional
  read-only corpus loaded at start. It is one object shared by every call (per-call copies share
  it by reference) and changes under its own lock.

For every match length m (up to max_depth - 1), the continuations below the match are scored by
frequency (a path's probability is the product of child / parent counts), cut at min_token_prob,
and limited to max_spec_factor * m + max_spec_offset nodes, so longer matches may draft more; the
candidate set with the highest expected accepted tokens (sum of its node probabilities) wins.
With `tree: true` that set is the best-first tree of the most probable nodes within max_nodes
(several frequent branches, which the tree verifier checks at once), with `tree: false` one path
(Arctic Inference's path mode). Proposals are point masses: lossless under every sampler.

A call's output enters its scope's tree when the call finishes (the loop's finish hook), so a
draft never depends on how concurrent calls interleave, and a scope only ever drafts from its
own outputs (and the corpus): `generate(..., cache_scope="user-17")`.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, List, Optional, Sequence

from specdec.atomic import atomic_write_bytes
from specdec.config import setting
from specdec.errors import ConfigError
from specdec.tree import CandidateTree, root_to_leaf_paths, host_to_device
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy
from .suffix_tree import ROOT, SuffixTree, best_path, best_tree

CACHE_FORMAT = "specdec-suffix-cache"
CACHE_VERSION = 1
# the drafting gate (Suffix._gate_open): moving-average weight of a drafted step's kept tokens, the
# steps skipped before the first look again, and the longest gap
GATE_WEIGHT = 0.1
GATE_PRIOR = 2.0          # a bucket's average before its first drafted step, x min_gain: ~7 misses in a row close it
GATE_FIRST_GAP = 4
GATE_MAX_GAP = 64
# match lengths are gated per bucket (a copy after a long match goes on right far more often than
# one after 2 tokens): each bound is its bucket's largest length
GATE_BUCKETS = (2, 3, 5, 8, 13)


def match_bucket(length: int) -> int:
    return next((i for i, bound in enumerate(GATE_BUCKETS) if length <= bound), len(GATE_BUCKETS))


def gate_temperature(sampling) -> str:
    """greedy or sampled: a point mass is kept far less often when sampling."""
    return "greedy" if sampling is None or sampling.greedy else "sampled"


@dataclass
class SuffixConfig:
    """The `suffix:` section. Depth 24 and min_token_prob 0.1 as Arctic Inference's vLLM integration;
    a CPU-sized node budget like prompt lookup's, no 1-token matches and a speculation factor of 6
    (Arctic: 1.0, and 1-token matches): on a CPU a verify step of a few nodes costs more than a plain
    step whatever they hold, so a draft must be worth it (prompt lookup's rule: a 2-gram match,
    then up to 10 tokens). benchmarks/results/suffix/README.md has the replay and the runs behind it."""
    max_depth: int = setting(24, min=2)                # suffix tree depth: longest match + its continuation
    max_nodes: int = setting(16, min=1)                # node budget of one proposal
    max_spec_factor: float = setting(6.0, above=0.0)   # a match of m tokens drafts at most factor * m + offset nodes
    max_spec_offset: float = setting(0.0, min=-64.0, max=64.0)   # (Arctic allows a negative offset)
    min_token_prob: float = setting(0.1, min=0.0, max=1.0)   # drop nodes whose path probability is lower
    min_match: int = setting(2, min=1)                 # shortest suffix match drafted from (Arctic: 1)
    min_gain: float = setting(0.5, min=0.0)            # drafts from a (temperature, match length) bucket whose recent
    #                                                    drafted steps kept fewer tokens than this on average pause
    #                                                    (looked at again after a gap that doubles); 0: always draft
    tree: bool = True                                  # False: a single path (Arctic Inference's path mode)
    max_cached_tokens: int = setting(200_000, min=0)   # outputs kept across calls (all scopes); 0: no cross-call cache
    corpus: List[str] = field(default_factory=list)    # files / folders loaded at start: .json token lists, else text
    cache_path: Optional[str] = None                   # the global cache is loaded from here (if the file exists)
    #                                                    and save() writes here
    scope: str = "default"                             # cache scope of calls that pass no cache_scope


CONFIG_SECTIONS = {"suffix": SuffixConfig}


class SuffixCacheError(ConfigError):
    """A saved suffix cache (or corpus file) that cannot be read."""


class SuffixCache:
    """The cross-call half of SuffixDecoding: one suffix tree per cache scope over the outputs of
    finished calls, the oldest evicted first past max_cached_tokens, and a read-only corpus tree
    that every scope reads. Shared by reference by every call of one Speculator; every change and
    every read goes through `lock` (a call's finish may run while another thread saves)."""

    def __init__(self, max_depth: int, max_cached_tokens: int):
        self.max_depth = int(max_depth)
        self.max_cached_tokens = int(max_cached_tokens)
        self.lock = threading.Lock()
        self.scopes: dict[str, SuffixTree] = {}
        self.order: collections.deque[tuple[str, int, int]] = collections.deque()   # (scope, stream, tokens), oldest first
        self.cached_tokens = 0
        self.corpus = SuffixTree(self.max_depth)
        self.next_stream = 0
        self.max_token = -1              # largest token id held: checked against the target's vocabulary

    # ------------------------------------------------------------------ writing
    def add(self, scope: str, tokens: Sequence[int]) -> None:
        """Cache one finished output under `scope`, evicting the oldest outputs to stay in bound."""
        if self.max_cached_tokens <= 0 or not tokens:
            return
        tokens = list(tokens)[-self.max_cached_tokens:]      # an output longer than the bound keeps its end
        with self.lock:
            while self.order and self.cached_tokens + len(tokens) > self.max_cached_tokens:
                old_scope, stream, size = self.order.popleft()
                tree = self.scopes[old_scope]
                tree.remove(stream)
                self.cached_tokens -= size
                if not tree.streams:
                    del self.scopes[old_scope]
            tree = self.scopes.get(scope)
            if tree is None:
                tree = self.scopes[scope] = SuffixTree(self.max_depth)
            tree.extend(self.next_stream, tokens)
            self.order.append((scope, self.next_stream, len(tokens)))
            self.next_stream += 1
            self.cached_tokens += len(tokens)
            self.max_token = max(self.max_token, max(tokens))

    def clear(self) -> None:
        """Forget every cached output (all scopes); the corpus stays (it was given at load)."""
        with self.lock:
            self.scopes.clear()
            self.order.clear()
            self.cached_tokens = 0

    def add_corpus(self, streams: Sequence[Sequence[int]]) -> None:
        with self.lock:
            for tokens in streams:
                self.corpus.extend(len(self.corpus.streams), tokens)
                if tokens:
                    self.max_token = max(self.max_token, max(tokens))

    # ------------------------------------------------------------------ reading
    def trees_for(self, scope: str) -> list[SuffixTree]:
        """The trees a call in `scope` may draft from (call it under `lock`)."""
        own = self.scopes.get(scope)
        return [tree for tree in (own, self.corpus) if tree is not None and tree.num_tokens]

    def outputs(self) -> list[tuple[str, list[int]]]:
        """(scope, tokens) of every cached output, oldest first."""
        with self.lock:
            return [(scope, list(self.scopes[scope].streams[stream])) for scope, stream, _ in self.order]

    def stats(self) -> dict:
        with self.lock:
            trees = list(self.scopes.values()) + [self.corpus]
            return {"entries": len(self.order), "tokens": self.cached_tokens, "scopes": len(self.scopes),
                    "corpus_streams": len(self.corpus.streams), "corpus_tokens": self.corpus.num_tokens,
                    "nodes": sum(tree.num_nodes for tree in trees),
                    "memory_bytes": sum(tree.memory_bytes() for tree in trees),
                    "max_cached_tokens": self.max_cached_tokens}

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the cached outputs (not the corpus) atomically (specdec.atomic): a crash mid-write
        leaves the previous file whole."""
        payload = json.dumps({"max_depth": self.max_depth,
                              "outputs": [[scope, tokens] for scope, tokens in self.outputs()]},
                             separators=(",", ":")).encode()
        header = json.dumps({"format": CACHE_FORMAT, "version": CACHE_VERSION, "bytes": len(payload),
                             "sha256": hashlib.sha256(payload).hexdigest()}).encode()
        atomic_write_bytes(path, header + b"\n" + payload)

    def load(self, path: str | os.PathLike) -> None:
        """Add the outputs saved at `path` (in their order, within this cache's bound)."""
        for scope, tokens in read_cache_file(path):
            self.add(scope, tokens)


def read_cache_file(path: str | os.PathLike) -> list[tuple[str, list[int]]]:
    """The (scope, tokens) outputs of a saved cache; a clear SuffixCacheError for anything else."""
    what = f"the suffix cache {str(path)!r}"
    fix = "delete the file (or set suffix.cache_path to another path) to start with an empty cache"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SuffixCacheError(f"{what} cannot be read ({exc}): {fix}") from exc
    head, newline, payload = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except (ValueError, UnicodeDecodeError):
        header = None
    if not newline or not isinstance(header, dict) or header.get("format") != CACHE_FORMAT:
        raise SuffixCacheError(f"{what} is not a specdec suffix cache (no {CACHE_FORMAT!r} header): {fix}")
    if header.get("version") != CACHE_VERSION:
        raise SuffixCacheError(f"{what} has format version {header.get('version')!r}, this specdec reads "
                               f"version {CACHE_VERSION}: {fix}")
    if len(payload) != header.get("bytes") or hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise SuffixCacheError(f"{what} is truncated or corrupt ({len(payload)} of {header.get('bytes')} payload "
                               f"bytes, checksum {'ok' if hashlib.sha256(payload).hexdigest() == header.get('sha256') else 'wrong'}): {fix}")
    try:
        outputs = json.loads(payload)["outputs"]
        checked = [(scope, tokens) for scope, tokens in outputs]
    except (ValueError, KeyError, TypeError) as exc:
        raise SuffixCacheError(f"{what} has an unreadable payload ({exc}): {fix}") from exc
    for scope, tokens in checked:
        if not isinstance(scope, str) or not isinstance(tokens, list) or \
                not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            raise SuffixCacheError(f"{what} holds an entry that is not (scope name, token ids >= 0): {fix}")
    return checked


def files_below(entries: Sequence[str], what: str, expected: str) -> list[Path]:
    """The files `entries` name, a folder standing for every file below it (sorted); an entry that is
    neither is a ConfigError naming it as `what` and the `expected` kind of paths."""
    files: list[Path] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{what} {entry!r} is neither a file nor a folder: give existing paths ({expected})")
    return files


def read_corpus(entries: Sequence[str], tokenizer) -> list[list[int]]:
    """Token streams from `suffix.corpus` entries: a folder stands for the files below it (sorted);
    a .json file holds one list of token ids or a list of them; any other file is text, tokenized."""
    files = files_below(entries, "suffix.corpus entry", "text files, .json token lists, or folders of them")
    streams: list[list[int]] = []
    for path in files:
        if path.suffix == ".json":
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"suffix.corpus file {str(path)!r} is not valid JSON ({exc}): a .json corpus file "
                                  f"holds a list of token ids or a list of such lists") from exc
            data = [data] if data and all(isinstance(t, int) for t in data) else data
            if not isinstance(data, list) or not all(
                    isinstance(s, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in s)
                    for s in data):
                raise ConfigError(f"suffix.corpus file {str(path)!r} must hold a list of token ids (>= 0) or a list "
                                  f"of such lists")
            streams.extend(data)
        else:
            if tokenizer is None:
                raise ConfigError(f"suffix.corpus file {str(path)!r} is text and needs the target's tokenizer: load "
                                  f"with specdec.load(...), or give token ids in a .json file")
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"suffix.corpus file {str(path)!r} cannot be read as text ({exc}): give UTF-8 "
                                  f"text files or .json token lists") from exc
            streams.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return streams


class Suffix(BaseStrategy):
    name = "suffix"
    needs_hidden_states = False

    # defaults: SuffixConfig's, the one source of them
    def __init__(self, *, max_depth: int = SuffixConfig.max_depth, max_nodes: int = SuffixConfig.max_nodes,
                 max_spec_factor: float = SuffixConfig.max_spec_factor,
                 max_spec_offset: float = SuffixConfig.max_spec_offset,
                 min_token_prob: float = SuffixConfig.min_token_prob, tree: bool = SuffixConfig.tree,
                 min_match: int = SuffixConfig.min_match, min_gain: float = SuffixConfig.min_gain,
                 max_cached_tokens: int = SuffixConfig.max_cached_tokens, scope: str = SuffixConfig.scope,
                 cache_path: str | None = None, cache: SuffixCache | None = None):
        for key, value, low in (("max_depth", max_depth, 2), ("max_nodes", max_nodes, 1), ("min_match", min_match, 1),
                                ("max_cached_tokens", max_cached_tokens, 0)):
            if int(value) < low:
                raise ConfigError(f"suffix.{key} must be >= {low}, got {value}")
        if not max_spec_factor > 0:
            raise ConfigError(f"suffix.max_spec_factor must be > 0, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ConfigError(f"suffix.min_token_prob must be in [0, 1], got {min_token_prob}")
        self.max_depth, self.max_nodes = int(max_depth), int(max_nodes)
        self.max_spec_factor, self.max_spec_offset = float(max_spec_factor), float(max_spec_offset)
        self.min_token_prob, self.tree = float(min_token_prob), bool(tree)
        self.min_match = int(min_match)
        if not min_gain >= 0:
            raise ConfigError(f"suffix.min_gain must be >= 0, got {min_gain}")
        self.min_gain = float(min_gain)
        # the drafting gate: per (temperature kind, match bucket) [kept tokens per drafted step (moving
        # average), steps since the last look, gap]; shared by a Speculator's calls (per-call copies
        # share the dict), like the cache
        self.gate: dict[tuple, list] = {}
        self.gate_key: tuple | None = None        # the bucket of this step's draft (None: nothing drafted)
        self.default_scope = str(scope)
        self.cache_path = cache_path
        self.cache = cache if cache is not None else SuffixCache(self.max_depth, max_cached_tokens)
        if cache_path is not None and Path(cache_path).exists():
            self.cache.load(cache_path)
        self.device = "cpu"
        self.local = SuffixTree(self.max_depth)   # this call's prompt + output (reset() makes a fresh one)
        self.scope = self.default_scope
        self.state: DecodeState | None = None
        self.match_length = 0                     # match length of the last draft (0: nothing drafted)

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        self.device = target.device
        vocab = target.get_input_embeddings().num_embeddings
        if self.cache.max_token >= vocab:       # such a draft would index past the embedding mid-generation
            raise ConfigError(f"the suffix cache / corpus holds token id {self.cache.max_token}, outside the target's "
                              f"vocabulary of {vocab}: it was built with another tokenizer; clear suffix.cache_path "
                              f"/ suffix.corpus or use the matching model")

    def reset(self, state: DecodeState) -> None:
        scope = getattr(state, "cache_scope", None)
        self.scope = self.default_scope if scope is None else scope
        self.state = state
        self.local = SuffixTree(self.max_depth)     # a new one: a call's copy must not share it
        self.local.extend(0, state.token_ids)
        self.gate_key = None

    def propose(self, state: DecodeState) -> CandidateTree:
        self._catch_up(state)
        self.gate_key = None
        if state.max_depth <= 0:
            return CandidateTree.empty(self.device)
        tokens, parents, _ = self.draft(state.token_ids, state.max_depth, state.eos_token_ids)
        if not tokens or not self._gate_open(state):
            return CandidateTree.empty(self.device)
        import torch
        return CandidateTree(host_to_device(tokens, self.device), tuple(parents))

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self._catch_up(state)
        if self.gate_key is not None and result is not None:
            self._gate_record(self.gate_key, result.num_accepted)
            self.gate_key = None

    # the gate: a drafted step costs more than a plain one (on a CPU even for a few nodes: docs/benchmarks.md),
    # so a draft pays only when it keeps enough tokens. Where this call's or earlier calls' drafts from
    # matches of this length kept fewer than min_gain tokens per drafted step lately (e.g. samples at
    # T = 0.8 drafting from other samples of the same prompt: point masses kept with p(x) only), drafting
    # pauses, and is tried again after a gap that doubles while it keeps not paying (up to GATE_MAX_GAP).
    def _gate_open(self, state: DecodeState) -> bool:
        if self.min_gain <= 0:
            return True
        key = (gate_temperature(state.sampling), match_bucket(self.match_length))
        entry = self.gate.get(key)
        if entry is None or entry[0] >= self.min_gain:
            self.gate_key = key
            return True
        entry[1] += 1
        if entry[1] < entry[2]:
            return False
        entry[1] = 0                                       # a look after the gap
        entry[2] = min(2 * entry[2], GATE_MAX_GAP)
        self.gate_key = key
        return True

    def _gate_record(self, key: tuple, kept: int) -> None:
        entry = self.gate.get(key)
        if entry is None:
            entry = self.gate[key] = [GATE_PRIOR * self.min_gain, 0, GATE_FIRST_GAP]
        entry[0] = (1 - GATE_WEIGHT) * entry[0] + GATE_WEIGHT * kept
        if entry[0] >= self.min_gain:
            entry[2] = GATE_FIRST_GAP

    # auto's lookup part (strategies/auto.py calls these as it does prompt lookup's)
    def propose_paths(self, state: DecodeState) -> list[list[int]]:
        """The drafted tree as token paths, root to leaf (auto merges them with its drafter's)."""
        self._catch_up(state)
        if state.max_depth <= 0:
            return []
        tokens, parents, _ = self.draft(state.token_ids, state.max_depth, state.eos_token_ids)
        return [[tokens[node] for node in path] for path in root_to_leaf_paths(parents)]

    def catch_up(self, token_ids: Sequence[int]) -> None:
        """Add the committed tokens not in this call's tree yet."""
        done = self.local.num_tokens
        if len(token_ids) > done:
            self.local.extend(0, token_ids[done:])

    def finish(self, state: DecodeState) -> None:
        """The call has finished (the loop's hook): its output joins its scope's cache."""
        self.cache.add(self.scope, state.token_ids[state.prompt_len:])

    def forget(self) -> None:
        """Drop every cached output (a benchmark workload starting from nothing)."""
        self.cache.clear()

    def _catch_up(self, state: DecodeState) -> None:
        self.catch_up(state.token_ids)

    # ------------------------------------------------------------------ drafting
    def draft(self, context: Sequence[int], max_levels: int, eos_token_ids: Collection[int] = ()):
        """The best-scoring candidate set for `context` (this call's prompt + output): (tokens,
        parents, probs), point masses, at most max_levels deep. Each match length is drafted from
        every tree that holds the match - this call's tree (through its open nodes, no walk) and
        its scope's cached trees and the corpus (walking the context's suffixes) - with their
        counts added up (suffix_tree.best_path / best_tree)."""
        stop = frozenset(eos_token_ids)
        opened = self.local.open.get(0, [])                # [k]: the node of the context's length-k suffix
        with self.cache.lock:
            # every match length's parts, shortest first, up to the first length no tree holds with a
            # continuation (a longer suffix only occurs where every shorter one does)
            others = self.cache.trees_for(self.scope)
            nodes = [ROOT] * len(others)                  # per cached tree: its node of the current suffix
            matches: list[tuple[int, list]] = []
            for length in range(1, min(self.max_depth - 1, len(context)) + 1):
                parts = []
                if length < len(opened) and self.local.cont[opened[length]] > 0:   # occurred before, here
                    parts.append((self.local, opened[length]))
                for k, tree in enumerate(others):
                    if nodes[k] >= 0:
                        nodes[k] = tree.match(context[len(context) - length:])
                        if nodes[k] >= 0 and tree.cont[nodes[k]] > 0:
                            parts.append((tree, nodes[k]))
                if not parts:
                    break
                matches.append((length, parts))
            # longest first: a shorter match wins only with a strictly higher score (ties go to the
            # longer, as Arctic), and it cannot when its node budget (an upper bound on its score, a
            # sum of probabilities <= 1) is no higher than the best score so far
            best: tuple[float, tuple, int] = (0.0, ([], [], []), 0)
            for length, parts in reversed(matches):
                if length < self.min_match:
                    break
                budget = min(self.max_nodes, int(length * self.max_spec_factor + self.max_spec_offset + 1e-6))
                if budget <= best[0]:
                    break                                 # budgets only shrink with the match length
                if self.tree:
                    drafted = best_tree(parts, budget, max_levels, self.min_token_prob, stop)
                else:
                    drafted = best_path(parts, min(budget, max_levels), self.min_token_prob, stop)
                score = sum(drafted[2])
                if drafted[0] and score > best[0]:
                    best = (score, drafted, length)
        self.match_length = best[2]           # of the last draft: auto calibrates its nodes per match length
        return best[1]

    # ------------------------------------------------------------------ the cache, for users
    def cache_stats(self) -> dict:
        """entries (cached outputs), tokens, scopes, corpus size, trie nodes and estimated memory."""
        return self.cache.stats()

    def save(self, path: str | os.PathLike | None = None) -> None:
        """Persist the cached outputs (atomic write) to `path`, by default suffix.cache_path."""
        path = path if path is not None else self.cache_path
        if path is None:
            raise ConfigError("suffix.save() needs a path: pass one or set suffix.cache_path")
        self.cache.save(path)


def from_config(cfg, target, tokenizer, device, dtype) -> Suffix:
    c = cfg.suffix
    suffix = Suffix(max_depth=c.max_depth, max_nodes=c.max_nodes, max_spec_factor=c.max_spec_factor,
                    max_spec_offset=c.max_spec_offset, min_token_prob=c.min_token_prob, tree=c.tree, min_match=c.min_match,
                    min_gain=c.min_gain,
                    max_cached_tokens=c.max_cached_tokens, scope=c.scope, cache_path=c.cache_path)
    if c.corpus:
        suffix.cache.add_corpus(read_corpus(list(c.corpus), tokenizer))
    return suffix
