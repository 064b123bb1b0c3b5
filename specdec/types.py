"""The state strategies see, the result of one step, and per-call statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, NamedTuple

import torch

from .sampling import SamplingParams, TorchRandom
from .tree import CandidateTree

if TYPE_CHECKING:
    from .coupled import GumbelNoise


@dataclass
class DecodeState:
    """What a strategy may read when it proposes. The loop owns and updates it."""
    token_ids: list[int]                  # committed tokens: prompt + generated; the last one is pending
    prompt_len: int
    sampling: SamplingParams
    rng: TorchRandom                      # the one random source of this call: every draw of drafting and
    #   acceptance goes through it (uniforms, bernoulli, categorical, draw_without_replacement); the loop
    #   makes one per call, the law tests substitute one that enumerates every outcome (tests/law.py)
    max_depth: int                        # levels a tree may have now (budget left - 1); deeper is an error
    eos_token_ids: frozenset[int] = frozenset()
    prompt_hidden: torch.Tensor | None = None   # [P - 1, F] target features of the committed prompt
    #   tokens (all but the pending one), from the prefill; set before reset() for strategies with
    #   needs_hidden_states, None otherwise. Row -1 produced the pending token.
    noise: GumbelNoise | None = None      # the coupled sampler's noise (None: rejection sampler or
    #   greedy). Drafters then propose specdec.coupled.coupled_proposals(draft logits, positions,
    #   noise, k); a node at depth d guesses position len(token_ids) + d.
    batch_size: int = 1                   # rows verified together this step (generate(list)): strategies that
    #   price their trees (auto) use the verify cost of a forward of that many rows
    batch_setup_s: float = 0.0            # seconds the batch call has spent so far starting prompts (their
    #   prefill, between steps): time between a row's steps that no mode of decoding spent (auto's batch gate)
    batch_waiting: int = 0                # prompts of the batch call not started yet: 0 in its drain, where
    #   rows only finish (auto's batch gate does not look at speculation there: it would leave the rows ragged)
    pending: torch.Tensor | None = None   # [1] the pending token (token_ids[-1]) on the target's device, where
    #   the engine has it (greedy, coupled: the verdict's; None otherwise): drafters feed it without a copy
    cache_scope: str | None = None        # the call's cache scope (generate(..., cache_scope=)): strategies
    #   that learn across calls (suffix) draft only from what calls of the same scope produced
    prompt_top_ids: torch.Tensor | None = None   # [P - 1, k] long on the device: the target's top-k next
    #   tokens after each committed prompt token but the pending one, from the prefill; set before reset()
    #   for strategies with top_k_ids = k > 0, None otherwise (row i follows token_ids[i])
    target_cache: object | None = None    # the target's KV cache of this call (a transformers Cache) where one
    #   sequence decodes on the eager verifier; None in batches and under compile. Before each proposal every
    #   layer holds the committed tokens but the pending one. A strategy that runs the target's own lower
    #   layers (early_exit's KV reuse) writes their KV for its chain there and hands it to the verify in
    #   CandidateTree.lower_run; rows it writes that no lower_run claims are dropped before the verify

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len


@dataclass(frozen=True)
class StepResult:
    """What one verify step decided, as strategies see it in observe()."""
    tree: CandidateTree
    accepted: tuple[int, ...]        # node indices of the accepted path, root first
    next_token: int                  # the target's token after that path
    committed_before: int            # len(token_ids) before this step
    hidden: torch.Tensor | None = None   # [1 + num_accepted, F] target features of the pending
    #   token's row and the accepted nodes' rows, in path order (strategies with needs_hidden_states);
    #   hidden[-1] is the row that produced next_token
    top_ids: torch.Tensor | None = None  # [1 + N, k] long on the device: the target's top-k next tokens at
    #   every row of the forward, the pending token's (row 0) and every tree node's, accepted or not (row
    #   i + 1 = node i), best first, from its logits before the generation_config processing; strategies
    #   with top_k_ids = k > 0 get them, computed on the device right after the forward (no host read)
    input_ids: torch.Tensor | None = None   # [1 + N] long on the device: the forward's input ids, the
    #   pending token then the tree's tokens (the token each top_ids row follows); with top_ids. A drafter
    #   inside auto gets the rows of the pending token and of its own verified nodes (strategies/auto.py
    #   drafter_steps): read each row's token here, not from the tree
    verified: tuple[int, ...] | None = None   # the nodes of `tree` the forward verified, ascending; None: all of
    #   them. A strategy around this one may verify part of its tree (auto plans a drafter's tree with lookup's
    #   and keeps what pays): the others were never tried, so they say nothing of how often its guesses are kept

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)

    @property
    def num_verified(self) -> int:
        """How many of the tree's nodes the forward verified."""
        return self.tree.num_nodes if self.verified is None else len(self.verified)

    @property
    def next_row(self) -> int:
        """Row of the verifier's output that produced next_token (0 = the pending token's)."""
        return self.accepted[-1] + 1 if self.accepted else 0


class StepSplit(NamedTuple):
    """Where a verify step's time went, in milliseconds per verify step (Stats.step_split): drafting
    (propose + observe), the target's forward over the tree, everything else (acceptance, cache commit,
    stop rules, Python) and the prefill spread over the steps; with the tree nodes per step. The four
    parts times the steps make the call's total."""
    draft_ms: float
    verify_ms: float
    other_ms: float
    prefill_ms: float
    nodes: float


@dataclass
class Stats:
    new_tokens: int = 0
    target_forwards: int = 0          # verify forwards (prefill not counted)
    proposed_nodes: int = 0           # tree nodes sent to the verifier
    accepted_lengths: list[int] = field(default_factory=list)   # drafted tokens accepted per step
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0         # strategy.propose + strategy.observe
    verify_time_s: float = 0.0        # target forward over the tree
    total_time_s: float = 0.0         # whole call, prefill included
    profiled: bool = False            # the draft / verify split is exact: on a CPU always, on a GPU
    #   with `profile` on (else it says when GPU work was queued, not when it ran; the total is exact)
    seed: int | None = None           # the seed this call sampled with (a fresh one when seed=None was
    #   asked): generate(..., seed=stats.seed) draws the same sample again. None when greedy (nothing drawn)

    @property
    def tokens_per_forward(self) -> float:
        """Mean new tokens per target forward (tau)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / proposed tree nodes."""
        return sum(self.accepted_lengths) / self.proposed_nodes if self.proposed_nodes else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.accepted_lengths) / len(self.accepted_lengths) if self.accepted_lengths else 0.0

    @property
    def other_time_s(self) -> float:
        """Acceptance, cache commit, stop checks, Python: everything outside drafting and forwards."""
        return max(0.0, self.total_time_s - self.prefill_time_s - self.draft_time_s - self.verify_time_s)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s else 0.0

    def step_split(self) -> StepSplit:
        """Milliseconds per verify step of each part of the call, and nodes per step (zeros before a step)."""
        steps = self.target_forwards
        if not steps:
            return StepSplit(0.0, 0.0, 0.0, 0.0, 0.0)
        return StepSplit(*(1e3 * seconds / steps for seconds in (self.draft_time_s, self.verify_time_s,
                                                                   self.other_time_s, self.prefill_time_s)),
                         self.proposed_nodes / steps)

    @classmethod
    def summed(cls, calls: Iterable[Stats]) -> Stats:
        """Several calls' statistics as one call's: counts and times added, steps' accepted lengths joined
        (so tokens_per_second, tokens_per_forward and step_split are over all of them, not means of means)."""
        total = cls()
        calls = list(calls)
        for s in calls:
            total.new_tokens += s.new_tokens
            total.target_forwards += s.target_forwards
            total.proposed_nodes += s.proposed_nodes
            total.accepted_lengths.extend(s.accepted_lengths)
            total.prefill_time_s += s.prefill_time_s
            total.draft_time_s += s.draft_time_s
            total.verify_time_s += s.verify_time_s
            total.total_time_s += s.total_time_s
        total.profiled = bool(calls) and all(s.profiled for s in calls)
        return total

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
            "tokens_per_forward": self.tokens_per_forward, "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length, "proposed_nodes": self.proposed_nodes,
            "prefill_time_s": self.prefill_time_s, "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s, "other_time_s": self.other_time_s,
            "total_time_s": self.total_time_s, "tokens_per_second": self.tokens_per_second,
            "profiled": self.profiled, "seed": self.seed,
        }


@dataclass
class GenerationOutput:
    text: str                  # the new text only
    token_ids: list[int]       # the new tokens only
    stats: Stats
    finish_reason: str         # "eos", "stop", "length"; a Stream closed before it finished: "cancelled"
