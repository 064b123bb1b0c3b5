"""The one protocol every drafting strategy follows. No strategy bends these signatures.

`Strategy` is what every strategy must have (what Speculator checks): a name, whether it reads the
target's hidden states, and four methods. `BaseStrategy` declares every hook the engine may call
(specdec/loop.py, batch.py, api.py, profile.py, benchmarks/), each with its contract and a default
that changes nothing; every shipped strategy derives from it, and the engine calls nothing that is
not declared here. A strategy written against `Strategy` alone runs through `as_strategy`: the hooks
it defines are its own, the others the defaults. Two optional protocols sit beside it: a
`BatchDrafter` (what `batch_drafter()` returns: one drafter for all rows of a batch) and a
`LookupPart` (what auto asks of the lookup it merges with its drafter's tree).
"""
from __future__ import annotations

import copy
from typing import NamedTuple, Protocol, Sequence, runtime_checkable

import torch

from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult


class ExpectedCall(NamedTuple):
    """What one call of a drafter is expected to add, known without calling it (BaseStrategy.expected_call), or
    at most adds (a bound: a call priced by it that loses to lookup alone loses whatever it drafts)."""
    accept: tuple[float, ...] | None   # per token the call drafts along its path (a chain), the probability that
    #                                    the target keeps it given it kept the one before; None: not known yet, but
    #                                    it will be from the coming steps' verify forwards, without a call
    cost: float                        # the call's drafting, in target forwards of one row


@runtime_checkable
class Strategy(Protocol):
    """What every strategy has. The contracts of these members, and the optional hooks, are
    BaseStrategy's."""
    name: str
    needs_hidden_states: bool

    def bind(self, target, tokenizer) -> None: ...

    def reset(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState) -> CandidateTree: ...

    def observe(self, state: DecodeState, result: StepResult) -> None: ...


class BaseStrategy:
    """Every hook the engine may call on a strategy, with its contract. Only `name` and `propose` have
    no default; the rest default to doing nothing, so a strategy overrides what it uses."""

    name: str                          # the strategy's registry name (errors and reports name it)
    needs_hidden_states: bool = False  # ask the verifier for the target's hidden states: the prompt's in
    #                                    DecodeState.prompt_hidden, the kept rows' in StepResult.hidden. One
    #                                    sequence reads it (and feature_layers) again before each verify, so a
    #                                    strategy may ask on some steps only (early_exit's shadow tokens); the
    #                                    prefill and a batch's forwards read it once per call
    feature_layers: tuple[int, ...] | None = None   # which hidden states (None: the last layer's, what
    #                                    the lm_head reads), concatenated on the feature axis in this order
    max_nodes: int = 0                 # the most nodes a proposal holds (0: no stated budget); the
    #                                    Speculator sizes the KV cache for it up front (a larger tree
    #                                    still works: the cache then grows)
    draft_cost_s: float | None = None  # seconds one drafter call costs, where the strategy measures it as
    #                                    it runs (auto); None: `specdec profile` reports the call's
    #                                    drafting time per step instead
    tree_sizes: list[int] | None = None   # nodes proposed at each step of the current call, where the
    #                                    strategy sizes its trees per step (auto); None: not recorded
    top_k_ids: int = 0                 # k > 0: ask for the target's top-k next tokens at every row of each
    #                                    verify forward (StepResult.top_ids, computed on the device) and of
    #                                    the prefill (DecodeState.prompt_top_ids); 0: none, and nothing is
    #                                    computed (read once per step: a strategy may change it between steps)
    verify_whole: bool = False         # its trees are verified whole or not at all: a strategy around it (auto)
    #                                    may not prune them (lookahead: the window learns from every node's row)
    leads_greedy: bool = False         # held by auto beside a drafter that runs forwards, it leads greedy steps
    #                                    first (strategies/drafter_slots.py: first_leader): its draft is a read of
    #                                    what the target already computed, next to free, while its point masses
    #                                    are kept far less often once sampling
    top_k_prefill: bool = True         # with top_k_ids: the prefill computes them too (DecodeState.prompt_top_ids,
    #                                    from every prompt row's logits, chunk by chunk); false: the verify
    #                                    forwards only, and the prefill keeps computing its last row's logits alone
    #                                    (eagle's table chain, which seeds from the prompt's text instead)
    chain_nodes: Sequence[int] = ()    # the node indices of its last proposed tree that it read from a table
    #                                    instead of drafting (eagle's table chain, strategies/leaf_chain.py): a
    #                                    strategy around it (auto) calibrates their acceptance apart

    # ------------------------------------------------------------------ every call
    def bind(self, target, tokenizer) -> None:
        """Called once with the target model and tokenizer: check compatibility, move to its device."""

    def reset(self, state: DecodeState) -> None:
        """A new generation starts: state.token_ids is the prompt (its last token pending)."""

    def propose(self, state: DecodeState) -> CandidateTree:
        """Candidate tokens after the pending token; CandidateTree.empty() for none.
        At most state.max_depth levels: a deeper tree is a strategy bug, and the loop raises
        StrategyError (specdec.loop.check_depth) rather than cut it behind the strategy's back."""
        raise NotImplementedError(f"{type(self).__name__} must define propose(state)")

    def observe(self, state: DecodeState, result: StepResult) -> None:
        """The verdict of the last step; state.token_ids already holds the new tokens. Not called
        after the step a stop rule ends (finish is, then)."""

    def observe_steps(self, state: DecodeState, results: Sequence[StepResult]) -> None:
        """observe() of several steps in order: one step of a strategy that holds this one as its drafter,
        as the drafter sees it (auto's drafter_steps). Default: each observed in turn; a strategy may take
        them at once (token_recycling: one table write for all their rows)."""
        for result in results:
            self.observe(state, result)

    def finish(self, state: DecodeState) -> None:
        """Called once when a stop rule ends the call, in place of that step's observe, with all the
        new tokens in state.token_ids: keep what the strategy learns from a finished call (suffix's
        cache of outputs). Default: nothing."""

    def for_call(self) -> "BaseStrategy":
        """The strategy object a call runs on when another call holds this one (overlapping calls on
        one Speculator, every row of a batch): default a shallow copy. A copy shares the models and
        settings; reset() then gives it per-call state of its own, so a strategy's reset() must
        assign fresh objects for everything a call changes (not clear shared ones in place). What a
        strategy means to share across calls (auto's calibration) stays shared by reference; a
        strategy made of parts gives each part its own per-call copy here (auto)."""
        return copy.copy(self)

    # ------------------------------------------------------------------ inside a strategy that calls it (auto)
    def price_calls(self) -> None:
        """Called once, before bind, by a strategy that calls this one only where a call pays (auto): a
        drafter that can tell what a call would add without being called (expected_call) gets ready to, and
        reads what it needs from every step it observes, called or not. Default: nothing."""

    def expected_call(self, state: DecodeState) -> ExpectedCall | None:
        """What a call now would add and cost, known from the steps observed without calling it (early_exit:
        its acceptance from the target's own hidden states, strategies/shadow.py), after price_calls, or the
        most it could add (layer_skip: every token kept, at its draft cost); None (the default) where the
        drafter cannot say without being called. A caller does not call a drafter whose expected call loses."""
        return None

    # ------------------------------------------------------------------ set-up
    def use_compiled_verifier(self, compiled: bool) -> None:
        """Called once by the Speculator, before bind: whether its verify forward is compiled
        (`compile: true`). A strategy that times the verifier times the one the steps run (auto's
        cost profile). Default: nothing."""

    def use_row_linear(self, rows: int) -> None:
        """Called once by the Speculator, before bind: its verifier's `row_linear` setting (forwards of
        at most `rows` rows through the model's RowLinear twin; 0: none), so that a strategy that times
        the verifier times the forwards the steps run. Default: nothing."""

    def profile_setup(self, target) -> tuple[tuple[int, ...], int] | None:
        """(tree sizes, context length) of the verify-cost profile the strategy plans with on `target`
        (auto), which `specdec profile` measures again; None (the default): it plans with none."""
        return None

    def use_costs(self, profile) -> None:
        """`specdec profile` measured the profile of profile_setup() again (a costmodel.CostProfile):
        plan with it from now. Default: nothing."""

    # ------------------------------------------------------------------ batches (specdec.batch)
    def batch_drafter(self) -> "BatchDrafter | None":
        """The drafter whose proposals the rows of a batch run together (one forward per level for
        all rows), or None (the default): then each row proposes alone with propose(). Where it is
        not None, a row proposes in two phases around the batch's drafting: propose_start, then
        propose_end with this drafter's tree for the row."""
        return None

    def propose_start(self, state: DecodeState) -> bool:
        """Phase one of a batched proposal (only where batch_drafter() is not None): whether this row
        calls its batch drafter this step. Default: always."""
        return True

    def propose_end(self, state: DecodeState, drafted: CandidateTree | None,
                    drafted_s: float | None) -> CandidateTree:
        """Phase two: the row's tree, given what its batch drafter proposed for it (`drafted`, which
        took the row `drafted_s` seconds, its share of the batch's drafting; both None when
        propose_start said no). The same depth rule as propose(). Default: the drafter's tree as it is."""
        return drafted if drafted is not None else CandidateTree.empty()

    @staticmethod
    def fit_batch(rows: Sequence["BaseStrategy"], trees: Sequence[CandidateTree]) -> list[CandidateTree]:
        """The trees one batched forward verifies, once every row has proposed: called on the first
        row's strategy with every row's strategy (per-call copies of one strategy) and tree, in row
        order, when the batch has two rows or more. A strategy that plans per row may cut the trees to
        the width that pays for the whole batch (auto: strategies/batch_width.py); a cut tree must
        be prefix-closed (every node's parent kept). Default: the trees as proposed."""
        return list(trees)

    def prepare_batches(self, max_rows: int) -> None:
        """Called before a server runs batches of up to `max_rows` rows (specdec serve, at load): what a
        strategy measures the first time a batch size runs is measured now, so that no request waits
        for it (auto: its verify costs at each batch size). Default: nothing."""

    # ------------------------------------------------------------------ benchmarks
    def forget(self) -> None:
        """Drop what the strategy keeps across calls (suffix's cached outputs), so a benchmark
        workload starts from nothing; what it measured (cost profile, calibration) stays. Default:
        nothing."""

    def drafting_modules(self) -> list[torch.nn.Module]:
        """The torch modules the strategy runs to draft (draft model, heads, drafter): a benchmark
        counts their forwards as drafting. Default: the modules among its attributes."""
        return [value for value in vars(self).values() if isinstance(value, torch.nn.Module)]

    def verifying_modules(self) -> list[torch.nn.Module]:
        """The torch modules, other than the target itself, through which the verify runs the target's
        own layers for this strategy's trees (early_exit's upper part, with KV reuse): a benchmark
        counts their forwards as target forwards. Default: none."""
        return []


class DraftRows(Protocol):
    """The rows' drafting state of one batch drafter in a batch call (BatchDrafter.new_batch)."""

    def release(self, drafter) -> None:
        """The row of `drafter` finished: give back what the batch holds for it."""


class BatchDrafter(Protocol):
    """A drafter that drafts for many rows of a batch at once (BaseStrategy.batch_drafter): one
    propose_many per batch key and step, for every row that calls it."""

    def batch_key(self) -> int:
        """Rows whose drafters share this key draft together, in one DraftRows (a draft model's id)."""

    def new_batch(self) -> DraftRows:
        """Fresh drafting state for the rows of this key (made once per batch call, at first use)."""

    @staticmethod
    def propose_many(drafters: Sequence["BatchDrafter"], states: Sequence[DecodeState],
                     batch: DraftRows) -> list[CandidateTree]:
        """Every row's tree (drafters and states in row order; called on the first drafter), drafted
        side by side through `batch`: what each drafter's own propose() gives its row alone."""


class LookupPart(Protocol):
    """What auto asks of its lookup (prompt_lookup, suffix), a BaseStrategy besides: auto merges the
    lookup's paths with its drafter's tree and verifies the merged tree itself."""
    max_nodes: int                  # lookup nodes a step may add
    match_length: int | None        # the length of the match the last paths continue, where the lookup
    #                                 knows it (suffix: auto calibrates those nodes per length); else None

    def propose_paths(self, state: DecodeState) -> list[list[int]]:
        """The token paths propose() would merge into its tree."""

    def catch_up(self, token_ids: Sequence[int]) -> None:
        """Index the committed tokens: called in place of observe (the verified tree was auto's)."""


class _WithDefaults(BaseStrategy):
    """A strategy written against `Strategy` alone, driven as a BaseStrategy: each hook is the
    strategy's own where it defines one, else BaseStrategy's default; any other attribute reads
    through to it."""

    def __init__(self, strategy):
        self._strategy = strategy

    def __getattr__(self, attribute: str):
        if attribute == "_strategy":           # not set yet (a copy being made)
            raise AttributeError(attribute)
        return getattr(self._strategy, attribute)

    def _own(self, hook: str):
        """The strategy's own `hook`, or None where it defines none."""
        return getattr(self._strategy, hook, None)

    name = property(lambda self: self._strategy.name)
    needs_hidden_states = property(lambda self: self._strategy.needs_hidden_states)
    feature_layers = property(lambda self: self._own("feature_layers"))
    max_nodes = property(lambda self: self._own("max_nodes") or 0)
    draft_cost_s = property(lambda self: self._own("draft_cost_s"))
    tree_sizes = property(lambda self: self._own("tree_sizes"))
    top_k_ids = property(lambda self: self._own("top_k_ids") or 0)
    verify_whole = property(lambda self: bool(self._own("verify_whole")))
    leads_greedy = property(lambda self: bool(self._own("leads_greedy")))
    top_k_prefill = property(lambda self: self._own("top_k_prefill") is not False)
    chain_nodes = property(lambda self: self._own("chain_nodes") or ())

    def bind(self, target, tokenizer) -> None:
        self._strategy.bind(target, tokenizer)

    def reset(self, state: DecodeState) -> None:
        self._strategy.reset(state)

    def propose(self, state: DecodeState) -> CandidateTree:
        return self._strategy.propose(state)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self._strategy.observe(state, result)

    def observe_steps(self, state: DecodeState, results: Sequence[StepResult]) -> None:
        if (own := self._own("observe_steps")) is not None:
            own(state, results)
        else:
            BaseStrategy.observe_steps(self, state, results)

    def finish(self, state: DecodeState) -> None:
        if (own := self._own("finish")) is not None:
            own(state)

    def for_call(self) -> "BaseStrategy":
        own = self._own("for_call")
        return _WithDefaults(own() if own is not None else copy.copy(self._strategy))

    def price_calls(self) -> None:
        if (own := self._own("price_calls")) is not None:
            own()

    def expected_call(self, state: DecodeState) -> ExpectedCall | None:
        own = self._own("expected_call")
        return own(state) if own is not None else None

    def use_compiled_verifier(self, compiled: bool) -> None:
        if (own := self._own("use_compiled_verifier")) is not None:
            own(compiled)

    def use_row_linear(self, rows: int) -> None:
        if (own := self._own("use_row_linear")) is not None:
            own(rows)

    def profile_setup(self, target):
        own = self._own("profile_setup")
        return own(target) if own is not None else None

    def use_costs(self, profile) -> None:
        if (own := self._own("use_costs")) is not None:
            own(profile)

    def batch_drafter(self):
        own = self._own("batch_drafter")
        return own() if own is not None else None

    def propose_start(self, state: DecodeState) -> bool:
        own = self._own("propose_start")
        return own(state) if own is not None else True

    def propose_end(self, state: DecodeState, drafted, drafted_s) -> CandidateTree:
        own = self._own("propose_end")
        if own is None:
            return BaseStrategy.propose_end(self, state, drafted, drafted_s)
        return own(state, drafted, drafted_s)

    def fit_batch(self, rows, trees) -> list[CandidateTree]:
        own = self._own("fit_batch")
        return own([row._strategy for row in rows], trees) if own is not None else list(trees)

    def forget(self) -> None:
        if (own := self._own("forget")) is not None:
            own()

    def drafting_modules(self) -> list[torch.nn.Module]:
        own = self._own("drafting_modules")
        return own() if own is not None else BaseStrategy.drafting_modules(self._strategy)

    def verifying_modules(self) -> list[torch.nn.Module]:
        own = self._own("verifying_modules")
        return own() if own is not None else []


def as_strategy(strategy) -> BaseStrategy:
    """The strategy as the engine drives it: itself where it derives from BaseStrategy, else (one
    written against the bare Strategy protocol) a view that adds the defaults of the hooks it lacks."""
    return strategy if isinstance(strategy, BaseStrategy) else _WithDefaults(strategy)


def per_call(strategy) -> BaseStrategy:
    """The strategy object a call runs on when another call holds `strategy` (BaseStrategy.for_call)."""
    return as_strategy(strategy).for_call()
