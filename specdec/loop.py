"""The decoding loop: prefill, then propose -> verify -> accept -> commit -> observe, until a stop
rule fires inside an accepted run."""
from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from .acceptance import accept_greedy, accept_sampling
from .coupled import GumbelNoise, coupled_target_tokens
from .sampling import SamplingParams, TorchRandom, logits_to_probs
from .stopping import StopRules
from .errors import StrategyError
from .processing import LogitsProcessing
from .tables import ShapeTables
from .tree import CandidateTree, tree_shape, with_pending_root
from .types import DecodeState, Stats, StepResult
from .verifier import Verifier, pending_ids, top_k_ids


class _Clock:
    """Wall time for the stats. It never synchronises unless `profile` is on and the device is a
    GPU: then each reading first waits for the queued GPU work, so the draft / verify split is
    the device's own. Without profile on a GPU the split says when work was queued, not when it
    ran (the total stays honest: each step reads its verdict back, which waits for the device).
    On a CPU nothing is queued and the split is exact either way (`exact`)."""

    def __init__(self, device: torch.device, profile: bool = False):
        on_gpu = device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if profile and on_gpu else None
        self.exact = bool(profile) or not on_gpu

    def __call__(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()


def prefill_top_k(strategy) -> int:
    """The top-k ids the prefill computes for `strategy` (DecodeState.prompt_top_ids): its top_k_ids, unless it
    asks for them on the verify forwards only (top_k_prefill false)."""
    return strategy.top_k_ids if strategy.top_k_prefill else 0


def feature_layers(strategy) -> tuple[int, ...] | None:
    """Which target hidden states the strategy reads (None: none): its `feature_layers`, else the
    last layer's (what the lm_head reads) when it sets needs_hidden_states."""
    if not strategy.needs_hidden_states:
        return None
    return tuple(strategy.feature_layers or (-1,))


def check_depth(tree, max_depth: int, strategy) -> None:
    """A tree deeper than the budget left is a strategy bug: say so rather than re-index it."""
    if tree.num_nodes and max(tree.depths()) >= max_depth:
        raise StrategyError(f"strategy {strategy.name!r} proposed a tree "
                            f"{max(tree.depths()) + 1} levels deep, but only {max(max_depth, 0)} fit in the "
                            f"tokens left: a strategy must read state.max_depth and propose no deeper")


class Decoding:
    """One sequence's decoding between verify forwards: its state, strategy, stop rules and stats.
    `propose` asks the strategy for a tree; `settle` takes the target's outputs for [pending] + that
    tree (one row of a batch, or a forward of its own) and accepts, cuts at a stop rule, observes.
    decode() runs one; specdec.batch runs many side by side over one batched forward. `tables`: the
    shape tables of the verifier that runs its forwards (the commit's path index and the rejection
    index are read there; None: tables of its own). prompt_top_ids: the prefill's top-k ids
    (DecodeState.prompt_top_ids), for a strategy with top_k_ids. target_cache: the verifier's eager
    KV cache where this sequence decodes alone (DecodeState.target_cache)."""

    def __init__(self, strategy, prompt_ids: list[int], prompt_hidden, sampling: SamplingParams, stop: StopRules,
                 rng: TorchRandom, stats: Stats, noise: GumbelNoise | None, processing: LogitsProcessing,
                 clock: _Clock, start: float, cache_scope: str | None = None, tables: ShapeTables | None = None,
                 prompt_top_ids: torch.Tensor | None = None, target_cache=None):
        self.tables = tables if tables is not None else ShapeTables()
        self.strategy, self.sampling, self.stop, self.stats = strategy, sampling, stop, stats
        self.noise, self.processing, self.rng, self.clock, self.start = noise, processing, rng, clock, start
        self.state = DecodeState(token_ids=list(prompt_ids), prompt_len=len(prompt_ids), sampling=sampling,
                                 rng=rng, max_depth=stop.max_new_tokens - 1,
                                 eos_token_ids=stop.eos_token_ids, prompt_hidden=prompt_hidden, noise=noise,
                                 cache_scope=cache_scope, prompt_top_ids=prompt_top_ids, target_cache=target_cache)
        t = clock()
        strategy.reset(self.state)
        stats.draft_time_s += clock() - t
        self.proposed_at = 0.0

    @property
    def pending(self) -> torch.Tensor | None:
        """[1] the pending token on the device, when known there (DecodeState.pending)."""
        return self.state.pending

    @pending.setter
    def pending(self, tokens: torch.Tensor | None) -> None:
        self.state.pending = tokens

    def pending_token(self) -> int | torch.Tensor:
        """The next forward's pending input: the last verdict's token left on the device (greedy,
        coupled: no copy from the host), else the committed int."""
        return self.pending if self.pending is not None else self.state.token_ids[-1]

    def propose(self) -> CandidateTree:
        t0 = self.clock()
        tree = self.strategy.propose(self.state)
        check_depth(tree, self.state.max_depth, self.strategy)
        self.proposed_at = t0
        self.stats.draft_time_s += self.clock() - t0
        return tree

    def propose_start(self) -> bool:
        """A batch's two-phase proposal (specdec.batch.propose_rows), phase one: whether the row's
        strategy calls its batch drafter this step."""
        t0 = self.clock()
        wants = self.strategy.propose_start(self.state)
        self.proposed_at = t0
        self.stats.draft_time_s += self.clock() - t0
        return wants

    def propose_end(self, drafted: CandidateTree | None, drafted_s: float | None) -> CandidateTree:
        """Phase two: the row's tree from its drafter's proposal in the batch (None: not called), which
        took the row `drafted_s` seconds (its share of the batch's drafting)."""
        t0 = self.clock()
        tree = self.strategy.propose_end(self.state, drafted, drafted_s)
        check_depth(tree, self.state.max_depth, self.strategy)
        self.stats.draft_time_s += self.clock() - t0 + (drafted_s or 0.0)
        return tree

    def target_rows(self, tree: CandidateTree, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(processed target logits [1 + N, V], the target's token per row [1 + N] on the device or None):
        the tokens greedy (argmax) and the coupled sampler (noisy argmax) walk the tree with; None
        under the rejection sampler."""
        # the generation_config's law
        target_logits = self.processing.tree_rows(logits, self.state.token_ids, tree, self.tables)
        if self.sampling.greedy:
            return target_logits, target_logits.argmax(dim=-1)
        if self.noise is not None:    # coupled sampler: the greedy walk over the noisy argmaxes
            return target_logits, coupled_target_tokens(target_logits, tree, len(self.state.token_ids), self.noise)
        return target_logits, None

    def decide(self, tree: CandidateTree, logits: torch.Tensor):
        """The verdict on `tree` from the target's logits [1 + N, V] for [pending] + tree: the greedy
        walk (greedy, coupled; one host read) or rejection sampling (two)."""
        target_logits, target_tokens = self.target_rows(tree, logits)
        if target_tokens is not None:
            return accept_greedy(tree, target_tokens)
        return accept_sampling(tree, logits_to_probs(target_logits, self.sampling), self.rng, tables=self.tables)

    def settle(self, tree: CandidateTree, logits: torch.Tensor, hidden: torch.Tensor | None,
               verify_time_s: float, commit: Callable[[list[int], torch.Tensor | None], None],
               verdict=None, shape: tuple[int, ...] | None = None) -> tuple[list[int], str | None]:
        """(new tokens, finish reason or None) after the target's `logits` [1 + N, V] (and `hidden`
        [1 + N, F]) for [pending] + tree; `commit(kept rows, the same on the device or None)` keeps
        the accepted rows' KV (row 0 = pending). A batch passes the `verdict` it decided for all its
        rows at once (specdec.batch.batch_verdicts); else `decide` makes it. `shape`: the parents the
        forward's tables came from (TreeOutput.shape), for the kept rows' index."""
        state, stats = self.state, self.stats
        if verdict is None:
            verdict = self.decide(tree, logits)
        kept_rows = [0] + [node + 1 for node in verdict.accepted]
        kept_on_device = kept_rows_on_device(tree, kept_rows, logits.device, shape, self.tables)
        commit(kept_rows, kept_on_device)
        k = self.strategy.top_k_ids          # the strategy's top-k of every row (none: nothing computed)
        top_ids = top_k_ids(logits, k) if k else None                               # [1 + N, k]
        input_ids = forward_ids(self.pending_token(), tree, logits.device) if k else None   # [1 + N]
        self.pending = verdict.next_token_on_device

        run = verdict.path_tokens(tree) + [verdict.next_token]
        keep, reason = self.stop.cut(state.token_ids[state.prompt_len:], run)
        run = run[:keep]
        stats.target_forwards += 1
        stats.proposed_nodes += tree.num_nodes
        stats.accepted_lengths.append(len(verdict.accepted))
        stats.new_tokens += len(run)
        stats.verify_time_s += verify_time_s
        committed_before = len(state.token_ids)
        state.token_ids.extend(run)
        t3 = self.clock()
        if reason is None:
            state.max_depth = self.stop.max_new_tokens - state.num_generated - 1
            kept_hidden = None if hidden is None else kept(hidden, kept_on_device, len(kept_rows))
            self.strategy.observe(state, StepResult(tree, verdict.accepted, verdict.next_token, committed_before,
                                                    kept_hidden, top_ids, input_ids))
        else:                                 # what a strategy keeps of a finished call (suffix)
            self.strategy.finish(state)
        stats.draft_time_s += self.clock() - t3
        stats.total_time_s = self.clock() - self.start
        return run, reason


def forward_ids(pending: int | torch.Tensor, tree: CandidateTree, device: torch.device) -> torch.Tensor:
    """[1 + N] the input ids of the forward over [pending] + tree, on the device (StepResult.input_ids):
    the pending token where it is there (a copy from the host only where it is an int)."""
    return torch.cat([pending_ids(pending, device), tree.tokens.to(device)])


def kept_rows_on_device(tree: CandidateTree, kept_rows: list[int], device: torch.device,
                        shape: tuple[int, ...] | None = None, tables: ShapeTables | None = None) -> torch.Tensor | None:
    """[K] the kept rows (0 = pending, then the accepted path's rows) on the device, or None when they
    are a leading run 0..K-1 (a slice does): taken from the path table of `shape` (the parents the
    forward's mask came from: padded ones too, whose real rows have the same paths; None: [pending] +
    tree) kept in `tables` (the verifier's, where the forward left it), so nothing is copied from the host."""
    if kept_rows == list(range(len(kept_rows))):
        return None
    parents = shape if shape is not None else with_pending_root(tree.parents)
    return tree_shape(parents, device, tables).path(kept_rows[-1], len(kept_rows))


def kept(rows: torch.Tensor, kept_on_device: torch.Tensor | None, count: int) -> torch.Tensor:
    """The kept rows of a forward's per-row output [R, ...] (kept_rows_on_device's index, or the
    first `count` rows): indexed with a device tensor, never a Python list (a copy from the host)."""
    if kept_on_device is None:
        return rows[:count]
    return rows.index_select(0, kept_on_device.to(rows.device))


def decode(verifier: Verifier, strategy, prompt_ids: list[int], sampling: SamplingParams,
           stop: StopRules, generator: torch.Generator, stats: Stats,
           noise: GumbelNoise | None = None,
           processing: LogitsProcessing | None = None,
           profile: bool = False, cache_scope: str | None = None) -> Iterator[tuple[list[int], str | None]]:
    """Yield (new tokens, finish reason or None) once per verify step; `stats` fills as it goes.
    With `noise` (the coupled sampler) the target's token at each position is its Gumbel-max
    sample there, and acceptance is the greedy walk over those tokens. The engine reads the
    device back once per step (greedy, coupled) or twice (rejection sampling); `profile` adds a
    synchronisation around drafting and verifying on a GPU for an exact time split (_Clock)."""
    clock = _Clock(verifier.device, profile)
    stats.profiled = clock.exact
    layers = feature_layers(strategy)
    if processing is None:          # the checkpoint's generation_config processing (api builds it up front)
        processing = LogitsProcessing.for_generation(verifier.model, prompt_ids, stop.max_new_tokens)
    start = clock()
    prefilled = verifier.prefill_outputs(prompt_ids[:-1], layers, prefill_top_k(strategy))
    stats.prefill_time_s = clock() - start
    rng = TorchRandom(generator)     # the one random source of this call: drafting and acceptance
    sequence = Decoding(strategy, prompt_ids, prefilled.hidden, sampling, stop, rng, stats, noise, processing, clock,
                        start, cache_scope, verifier.tables, prefilled.top_ids,
                        verifier.cache if verifier.static is None else None)
    sequence.pending = pending_ids(prompt_ids[-1], verifier.device)     # staged once, with the call's setup
    while True:
        tree = sequence.propose()                                          # the strategy's guesses
        t1 = clock()
        # one target forward; the features asked for this step (a strategy may ask on some steps only)
        out = verifier.forward(sequence.pending_token(), tree, feature_layers(strategy))
        # accept, keep the accepted path's KV, cut at a stop rule, let the strategy observe
        run, reason = sequence.settle(tree, out.logits, out.hidden, clock() - t1, verifier.commit, shape=out.shape)
        yield run, reason
        if reason is not None:
            return
