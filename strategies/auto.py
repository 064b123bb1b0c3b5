"""auto: prompt lookup plus one neural drafter, merged into one tree, sized for this machine.

Every step: the lookup continuations (a trie) and, when it has been paying lately, the neural
drafter's tree (draft_model, medusa or eagle: whichever path was given; token_recycling when none
was) are merged into ONE CandidateTree (strategies/mixed.py). Each node gets an acceptance estimate
calibrated online (strategies/planner.Calibrator) and the planner keeps the prefix-closed part with the most expected
new tokens per second of verify (the cost profile measured at load, specdec/costmodel.py, scaled
by the step times observed since) plus drafting; nothing when nothing pays.

What may be pruned, losslessly: point masses (prompt lookup; every node when greedy or with the
coupled sampler) are functions of the context, so any of them may be dropped. A tree the drafter
*sampled* (draft_probs given, rejection sampling) is verified whole or not drafted at all: keeping
a sampled node because of the token it drew would change the law that node was drawn from. So is
the tree of a drafter that says verify_whole (lookahead: its window learns from every node's row),
priced whole against lookup alone. The drafter is called (or not) before it drafts, from the rates
planned on earlier steps and from what its last calls did: the tokens those steps kept against the
tokens lookup's own plan would have kept on them, both priced at the verify costs and the drafter's
measured cost per call (Auto.planned_loss, Auto.measured_loss; the calls by more than their call-to-call
spread: clear_loss; where calls clearly paid, clear_gain, their plans are not heard). Where it loses, it is
called only on looks, spaced by what a call loses (priced_gap), so a dear drafter (early_exit or layer_skip on
a shallow target, lookahead's rows on a CPU) costs a few calls, and one that starts paying comes back. A
drafter that can say what a call would add without being called (BaseStrategy.expected_call: early_exit, from
the target's own hidden states on the steps auto verifies) is priced by that before each call, and not called
where it loses.

auto may hold more drafters beside the first (auto.more_drafters): each is judged as above on its own records,
and a step calls at most one of them: on one sequence a leader gate (Auto._leader) runs one leader alone or the
others, whichever it measured faster, and strategies/drafter_slots.py picks among the others.

The drafter observes each step as its own (drafter_steps): the verdict on its own tree, with the
rows of its own accepted nodes, then one plain step per token committed after them (lookup's).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import List, Optional, Sequence
import copy
import itertools
import math
import statistics
import time
from typing import NamedTuple

from specdec.config import setting
from specdec.costmodel import CostProfile, batch_bucket, batch_costs, planning_costs, profile_sizes
from specdec.models import verified_on_chains
from specdec.tree import CandidateTree, merge_into_trie
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy, ExpectedCall, as_strategy
from .batch_gate import BatchGate
from .batch_width import best_width
from .drafter_slots import LOOK, PAYS, STEADY, DrafterSlot, call_cost, first_leader, pick
from .mixed import LOOKUP, NEURAL, merge_paths
from .paired_leader import PairedLeader, matched_length, score_guesses
from .planner import Calibrator, path_reach, plan, temperature_key
from .prompt_lookup import PromptLookup

DRAFTERS = (None, "none", "draft_model", "medusa", "eagle", "early_exit", "layer_skip", "mtp", "token_recycling",
            "lookahead", "rest")   # auto.drafter's choices


@dataclass
class AutoConfig:
    """The `auto:` section: prompt lookup plus the neural drafter whose path is given (eagle.path,
    heads.path or draft.path, in that order of preference), one merged tree per step, sized by the
    planner from the verify costs measured on this machine (specdec/costmodel.py)."""
    max_nodes: int = setting(32, min=0)     # the planner's ceiling on tree nodes per step
    drafter: Optional[str] = setting(None, choices=DRAFTERS)   # null = the first of eagle / medusa / draft_model
    #                                     with a path, else token_recycling; "none" = lookup only; early_exit /
    #                                     layer_skip / mtp: the target's own layers (its first, or all but skipped
    #                                     sublayers) or MTP modules; token_recycling: the target's own top-k table
    #                                     (needs no path; the token_recycling: section configures it); lookahead:
    #                                     its Jacobi window and n-gram pool, verified whole (the lookahead: section
    #                                     configures it); rest: a corpus datastore (rest.datastore=DIR, from
    #                                     `specdec index`)
    more_drafters: Optional[List[str]] = setting(None, item_choices=DRAFTERS[2:])  # drafters auto holds beside
    #                                     its first (auto.drafter, or the one picked as null says), e.g.
    #                                     [token_recycling] beside eagle: each is judged against lookup alone as the
    #                                     first is; a step calls one, the leader a gate measured faster (at greedy the
    #                                     table against the others, when sampling the first drafter against the
    #                                     others; in a batch the first alone); one that is the first is held once;
    #                                     none with auto.drafter none. null =
    #                                     [token_recycling] beside a trained drafter (eagle, medusa, draft_model: a
    #                                     drafter that costs a step real time, where the free table may draft
    #                                     better), else none; [] = the first alone
    lookup: bool = True                 # false: the drafter alone, its trees sized by the planner (max_nodes: auto
    #                                     for that strategy), e.g. auto heads.path=H auto.lookup=false
    lookup_with: str = setting("prompt_lookup", choices=("prompt_lookup", "suffix"))   # what finds the copies:
    #                                     prompt lookup (this call's context) or suffix (also earlier calls' outputs;
    #                                     the suffix: section configures it)
    profile: bool = True                # measure (or read the cached) verify costs at load; False = a linear guess
    profile_context: int = setting(128, min=1)  # context length of the measurement
    profile_repeats: int = setting(5, min=1)    # rounds over every tree size; the median of each size is kept
    explore_every: int = setting(8, min=1)      # look at a drafter that has not paid lately after this many steps
    #                                     (the gap doubles while it keeps not paying, up to 64, or for a dear drafter
    #                                     up to what keeps its looks to a small share of the time); 1 = every step
    #                                     (with several drafters, each called in turn: no leader gate)
    calibration_prior: float = setting(4.0, above=0.0)   # pseudo-observations pulling a calibration bucket
    #                                     towards its raw confidence
    sampled_confidence: bool = False    # true: sampled drafter nodes estimated per draft-probability bucket; false:
    #                                     per depth (an optimistic prior the first calls correct)
    batch_gate: bool = True             # in a batch (generate(list)), measure the batch's tokens/s with speculation
    #                                     on and off at each batch size and keep the faster, and on speculating steps
    #                                     the drafter's calls against lookup alone (strategies/batch_gate.py)


CONFIG_SECTIONS = {"auto": AutoConfig}


# raw estimate of a node with no draft probability, (first level, deeper), before calibration: a copied
# continuation that starts right tends to go on right
PRIOR_ACCEPT = {LOOKUP: (0.5, 0.85), NEURAL: (0.7, 0.7)}
# the same when sampling: a point mass x is kept with probability p(x) only (rejection or coupled), and
# lookup's rank-0 nodes are observed only on the steps without the drafter, so an optimistic prior
# is corrected only by skipping the drafter (benchmarks/results/defaults.md: what the calibrator
# counted, and what the greedy prior cost).
PRIOR_ACCEPT_SAMPLED = {LOOKUP: (0.1, 0.5), NEURAL: (0.7, 0.7)}
MAX_EXPLORE_GAP = 64
# sibling ranks calibrated apart (0, 1, 2, then 3 and later together): a drafter's later children are kept
# far less often than its first, and one estimate for all of them kept too many of them
MAX_RANK_KEY = 3
# tree shapes whose nodes' calibration keys are kept (Auto._keys_and_priors); past it the kept ones are dropped
SHAPES_KEYED = 256
# steps whose tokens/s make a leader's rate (Auto._leader): a step keeps 1 to depth + 1 tokens, so a mode's rate
# needs more of them than a batch size's gate does (where a step's tokens are a whole batch's)
LEADER_MEMORY = 48
# ... and a look at the other leader runs this many steps, forgetting its old ones (BatchGate.fresh_probes): its
# first pays the switch and is not counted, so 6 are, against the 2 of a batch gate's look, which is noisier than
# the gap between leaders where they are close (benchmarks/results/auto_leader)
LEADER_PROBE_STEPS = 8
# ... and after a look that lost, the next waits until the leader has run 1 / LEADER_EXPLORE times what the look
# lost (a batch gate's 0.02 guards against looks at speculation in a compute-bound batch, each step several plain
# ones): the two leaders cost about the same a step, and the one that lost early (the table, still learning) may
# win a few steps later; the gap between looks still doubles while they lose
LEADER_EXPLORE = 0.1
# a step proposed with fewer levels left than this (DecodeState.max_depth) is no sample of its leader's rate
# (strategies/paired_leader.py): the token budget, not the leader, caps what it keeps
PAIRED_FULL_DEPTH = 16
PAIRED_BIAS_EVERY = 4
# a drafter is judged by what its calls did, not only by what was planned: a plan trusts calibrated
# estimates, whose buckets mix nodes a drafter makes very differently (lookahead's window cells and its
# pooled n-grams share depths), while what a call kept, beside what lookup alone would have kept on the
# same step, is no estimate. The last CALL_MEMORY calls per context are kept (measured_rates); a context
# with fewer than MIN_CALLS_MEASURED is judged by all calls at its temperature kind, and with fewer than
# that by its plan alone.
CALL_MEMORY = 16
MIN_CALLS_MEASURED = 4
# what a call keeps varies widely from call to call (under sampling above all: 1 to depth + 1 tokens), so a
# few calls' mean says little. Calls are judged to lose only where they lose by more than MEASURED_MARGIN
# standard errors of their mean gain (clear_loss). Without it, a drafter that pays was priced out by a
# window of unlucky calls, and then kept out: once priced out its calls are looks, far apart, so the window
# that priced it out (chosen low by being the one that stopped it) stays for hundreds of steps.
MEASURED_MARGIN = 2.0
# looks at a drafter that does not pay are spaced by what its calls lose: at most LOOK_SHARE of the steps'
# time goes to them, so a drafter that costs several plain steps a call is looked at far more rarely than one
# that loses a few percent (the doubling gap alone looked at both every MAX_EXPLORE_GAP steps)
LOOK_SHARE = 0.05
LOOK_CALLS = 2            # calls a look makes: the one after the gap (a catch-up), then a steady, timed one
MAX_PRICED_GAP = 1024     # steps: however dear, a drafter that starts paying is found again within a long call
_ROW_IDS = itertools.count()          # a row's id for its batch gate (id() of a finished row's object is reused)

# suffix decoding's nodes are calibrated per length of the match they were drafted from (a copy after
# a 20-token match goes on right far more often than one after 2 tokens): buckets of match lengths,
# each bound the bucket's largest length
MATCH_BUCKETS = (1, 2, 3, 5, 8, 13, 21)


def match_bucket(length: int) -> int:
    """Bucket of a suffix match length (len(MATCH_BUCKETS) for longer ones)."""
    return next((i for i, bound in enumerate(MATCH_BUCKETS) if length <= bound), len(MATCH_BUCKETS))


class _Step(NamedTuple):
    """What propose decided, for observe."""
    merged: CandidateTree         # lookup + drafter tree before planning
    source: list                  # per merged node: LOOKUP or NEURAL
    keys: list                    # per merged node: (calibration key, confidence)
    keep: list                    # merged nodes verified (closed under parents)
    neural_tree: CandidateTree    # the drafter's own tree (empty when not called)
    proposed_at: float            # perf_counter when propose returned
    context: tuple                # (temperature key, lookup context: _lookup_context)
    lookup_alone: tuple | None = None   # the drafter was called: (lookup's paths, their node budget, the lookup
    #                                     nodes planned without it), what lookup alone would have verified
    slot: object = None                 # the DrafterSlot called (None: none was)


def _ema(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def _ema_pair(old: tuple[float, float] | None, new: tuple[float, float], weight: float = 0.3) -> tuple[float, float]:
    return new if old is None else (_ema(old[0], new[0], weight), _ema(old[1], new[1], weight))


def _check_arguments(**values) -> None:
    """Refuse what AutoConfig's limits refuse (setting(..., min=, above=)), for an Auto built
    directly: a bad value is named, not clamped or left to fail later (a zero prior divides by
    zero, zero repeats have no median)."""
    import dataclasses
    from specdec.config import _limit_problem
    from specdec.errors import ConfigError
    fields = {f.name: f for f in dataclasses.fields(AutoConfig)}
    for name, value in values.items():
        integer = isinstance(fields[name].default, int)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"Auto({name}={value!r}): expected {'an integer' if integer else 'a number'}")
        problem = _limit_problem(value, fields[name].metadata.get("limits", {}))
        if problem is not None:
            raise ConfigError(f"Auto({name}={value!r}): {problem} (the same limits as the auto.{name} setting)")


def _first_slot(name: str) -> property:
    """Auto's attribute `name`: its first drafter's (the one auto.drafter names) in slots[0]."""
    return property(lambda self: getattr(self.slots[0], name), lambda self, value: setattr(self.slots[0], name, value))


def _check_features(drafters) -> None:
    """Refuse drafters that ask the verifier for different hidden states: one verify forward reads one set."""
    from specdec.errors import ConfigError
    asking = {part.name: part.feature_layers for part in drafters if part.needs_hidden_states}
    if len(set(asking.values())) > 1:
        raise ConfigError(f"auto: its drafters read different hidden states of the target ({asking}); one verify "
                          "forward gives one set: keep one of them (auto.more_drafters)")


class Auto(BaseStrategy):
    name = "auto"
    # the first drafter's records, as attributes (what a single-drafter auto had): DrafterSlot says what each holds
    drafter = _first_slot("drafter")
    plan_with = _first_slot("plan_with")
    call_values = _first_slot("call_values")
    call_values_lock = _first_slot("call_values_lock")
    looks = _first_slot("looks")
    draft_cost_s = _first_slot("draft_cost_s")
    cost_known = _first_slot("cost_known")
    draft_times = _first_slot("draft_times")
    steps_since_call = _first_slot("steps_since_call")
    steady_call = _first_slot("steady_call")
    neural_calls = _first_slot("neural_calls")

    def __init__(self, lookup: PromptLookup | None = None, drafter=None, *, costs: CostProfile | None = None,
                 max_nodes: int = AutoConfig.max_nodes, explore_every: int = AutoConfig.explore_every,
                 calibration_prior: float = AutoConfig.calibration_prior, profile: bool = AutoConfig.profile,
                 profile_context: int = AutoConfig.profile_context, profile_repeats: int = AutoConfig.profile_repeats,
                 draft_cost_s: float | None = None, adapt_costs: bool = True,
                 sampled_confidence: bool = AutoConfig.sampled_confidence, batch_gate: bool = AutoConfig.batch_gate,
                 more_drafters: Sequence = ()):
        _check_arguments(max_nodes=max_nodes, explore_every=explore_every, calibration_prior=calibration_prior,
                         profile_context=profile_context, profile_repeats=profile_repeats)
        self.lookup = None if lookup is None else as_strategy(lookup)   # None: the drafter's trees alone, sized
        #                                                                  by the planner (a LookupPart besides)
        # the drafters auto holds, each with what auto learns of it (strategies/drafter_slots.py): the first is
        # `drafter` (None: lookup alone), then more_drafters, each called on the steps where it pays most
        drafters = [None if drafter is None else as_strategy(drafter)]
        if drafter is not None:
            drafters += [as_strategy(more) for more in more_drafters]
        self.slots = [DrafterSlot(d, NEURAL if i == 0 else f"{NEURAL}:{getattr(d, 'name', type(d).__name__)}",
                                  draft_cost_s if i == 0 else None) for i, d in enumerate(drafters)]
        _check_features(self.drafters())
        for part in self.drafters():
            part.price_calls()                # a drafter that can price a call without making it does (expected_call)
        self.top_k_ids = max((part.top_k_ids for part in self.drafters()), default=0)   # token_recycling's table
        self.top_k_prefill = any(part.top_k_ids and part.top_k_prefill for part in self.drafters())
        self.called: DrafterSlot | None = None   # the slot this step calls (propose_start)
        self.leaders: dict[tuple, str] = {}   # lookup context -> key of the drafter leading there (drafter_slots.pick)
        self.side = None                      # (tree, seconds) of a slot other than the first, drafted in propose_start
        self.match_length = None              # suffix: the match its last paths continue (keys their calibration)
        self.costs = costs
        self.batch_size = 1                   # rows of this step's verify forward (its costs: costs_at)
        self.batch_costs: dict[int, CostProfile] = {}   # batch size > 1 -> its profile (shared by per-call copies)
        self.use_batch_gate = batch_gate
        self.batch_gates: dict[tuple, BatchGate] = {}   # (batch bucket, temperature kind) -> speculate or not; shared
        #                                                 by the rows of a call and by later calls (what auto learns)
        self.leader_gates: dict[str, BatchGate] = {}    # one sequence holding several drafters: temperature kind ->
        #                                                  whether its first leader leads, or the others (_leader);
        #                                                  shared by calls like the batch gates
        self.paired_leaders: dict[str, PairedLeader] = {}   # "greedy" -> the table's lead judged on paired samples
        #                                                  (_paired_leader, where the table can be read for free);
        #                                                  shared by calls like the gates
        self.drafter_gates: dict[tuple, BatchGate] = {}  # the same keys -> on speculating steps, call the drafter, or
        #                                                 let lookup speculate alone (auto with both lookup and a drafter)
        self.target = None
        self.max_nodes = int(max_nodes)
        self.explore_every = int(explore_every)
        self.calibrator = Calibrator(prior=calibration_prior)
        self.profile = profile
        self.profile_context, self.profile_repeats = int(profile_context), int(profile_repeats)
        self.cost_scale = 1.0                 # observed step time / profiled verify time (context, load)
        # within a proposal, (cost_scale, batch size, the profile's costs listed): verify_cost's prices; else None
        self.step_costs: tuple[float, int, list[float]] | None = None
        self.listed_costs: tuple[CostProfile, list[float]] | None = None   # (a profile, its costs: _listed_costs)
        self.adapt_costs = adapt_costs        # False: plan with the profile and draft_cost_s as given (tests)
        # Each slot's plan_with, and plan_without here: planned (expected new tokens, nodes verified) of recent
        # steps with the drafter / with lookup alone, per context (greedy or how hot the sampling, and what lookup
        # offers this step: nothing, a short guess, a long one; see _lookup_context), as moving averages. Their
        # rates are priced when a decision is made, at the costs known then: a rate stored when the drafter was
        # last called would keep that step's costs (the first call's catch-up, a verify cost the step times have
        # since corrected) and, as the drafter is not called while it looks dear, would never be corrected.
        # Each slot's call_values: what calling it did (measured_rates). Its looks: per temperature kind, one
        # schedule for all contexts, so a drafter that loses everywhere is looked at as rarely whatever lookup
        # offers. Its draft_cost_s: seconds a call adds to a step (its propose and observe, merging and planning
        # its tree), the mean of its last calls without stalls (draft_times, catch-ups included: _time_call,
        # drafter_slots.call_cost) once one is timed (cost_known).
        self.plan_without: dict[tuple, tuple[float, float]] = {}
        # tree shape (parents, sources, ...) -> its nodes' calibration keys and priors (_keys_and_priors), shared by calls
        self.keys_by_shape: dict[tuple, list] = {}
        self.sampled_confidence = sampled_confidence
        self.tree_sizes: list[int] = []          # nodes verified per step of the current call
        self.accepted_nodes = {NEURAL: 0, LOOKUP: 0}   # accepted nodes per source, current call
        self.device = "cpu"
        self.chains = False                 # the target is verified on chains (linear-attention layers): plan one path
        # the Speculator's verifier is compiled (`compile: true`): the cost profile then times the
        # compiled forward, the one each step runs (use_compiled_verifier, called before bind)
        self.compiled_verifier = False
        self.row_linear = 0                 # likewise the verifier's row_linear setting (use_row_linear)

    # the hidden states the drafter asks for, read through on every step (early_exit asks on some steps only,
    # whether auto calls it or not) and from the per-call copy's own drafter
    @property
    def needs_hidden_states(self) -> bool:
        return any(part.needs_hidden_states for part in self.drafters())

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        return next((part.feature_layers for part in self.drafters() if part.needs_hidden_states), None)

    def drafters(self) -> list:
        """The drafters auto holds, the first one first (none: lookup alone)."""
        return [slot.drafter for slot in self.slots if slot.drafter is not None]

    # the drafter is told too: one that plans its own trees on a cost profile (token_recycling) must time
    # the forwards the steps run, not the stock layers' (which price a tree node several times dearer)
    def use_compiled_verifier(self, compiled: bool) -> None:
        self.compiled_verifier = bool(compiled)
        for part in self.drafters():
            part.use_compiled_verifier(compiled)

    def use_row_linear(self, rows: int) -> None:
        self.row_linear = int(rows)
        for part in self.drafters():
            part.use_row_linear(rows)

    def use_costs(self, profile: CostProfile) -> None:
        self.costs = profile
        for part in self.drafters():        # one that plans its own trees (token_recycling) plans on auto's
            part.use_costs(profile)

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        self.device = target.device
        self.chains = verified_on_chains(target)
        if self.lookup is not None:
            self.lookup.bind(target, tokenizer)
        if self.costs is None:
            self.costs = planning_costs(target, self.profile, *self.profile_setup(target), self.profile_repeats,
                                        self.compiled_verifier, self.row_linear)
        for part in self.drafters():
            # a drafter that plans its own trees on a cost profile (token_recycling) plans on auto's: one
            # measurement at load, and the same prices for the tree it offers as for the tree auto keeps (a
            # drafter that plans on none ignores use_costs)
            part.use_costs(self.costs)
            part.bind(target, tokenizer)
        self.target = target

    def costs_at(self, batch: int) -> CostProfile:
        """The verify costs for forwards of `batch` rows (specdec.costmodel.batch_costs; the first call, a
        warm-up, pays for measuring them)."""
        if batch <= 1 or not self.profile or self.target is None:
            return self.costs
        return batch_costs(self.batch_costs, self.target, batch, *self.profile_setup(self.target),
                           self.profile_repeats, self.row_linear)

    def prepare_batches(self, max_rows: int) -> None:
        """The verify costs of every batch bucket up to max_rows, now (costs_at measures them at the first
        batch of each size otherwise, stalling that batch), and its drafters' (the table sizes its own trees by
        them)."""
        self.costs_at(max_rows)
        for drafter in self.drafters():
            drafter.prepare_batches(max_rows)

    def for_call(self) -> "Auto":
        """Auto for a call that overlaps another: lookup and drafter with per-call state of their
        own; the calibration, the cost profile and the per-context plans stay shared (what auto
        learns across calls). Learned scalars (cost_scale, draft_cost_s) evolve in the copy alone."""
        from .base import per_call
        twin = copy.copy(self)
        twin.step_costs = None
        twin.lookup = per_call(self.lookup) if self.lookup is not None else None
        twin.slots = [slot.for_call(None if slot.drafter is None else per_call(slot.drafter)) for slot in self.slots]
        return twin

    def profile_setup(self, target) -> tuple[tuple[int, ...], int]:
        """(tree sizes, context length) of the cost profile this strategy reads for `target`
        (`specdec profile` measures the same one again)."""
        limit = getattr(target.config, "max_position_embeddings", None) or 4096
        return profile_sizes(self.max_nodes), max(1, min(self.profile_context, limit - self.max_nodes - 2))

    def reset(self, state: DecodeState) -> None:
        if self.lookup is not None:
            self.lookup.reset(state)
        for slot in self.slots:
            if slot.drafter is not None:
                slot.drafter.reset(state)
            slot.steps_since_call = 2         # the drafter has not seen this prompt: its first call catches up
            slot.first_call = True
        self.tree_sizes = []
        self.accepted_nodes = {NEURAL: 0, LOOKUP: 0}
        self.step = 0
        self.called, self.side = None, None
        self.step_costs = None                # a proposal an error cut short leaves no prices behind
        self.pending = None                   # what propose decided, for observe
        self.started = None                   # propose_start's lookup plan, for propose_end
        self.gate_row = next(_ROW_IDS)
        self.paired_mark = None               # (whether the table led, perf_counter, committed length, counted,
        #                                       the table's mode's trees) at the last proposal: _paired_leader
        self.paired_steps = 0                 # this call's steps judged by the paired judge
        self.paired_waiting: list[tuple] = []  # this call's steps whose table guesses await their text (the other
        #                                       drafter's: pairs; the table's own: the guesses' bias)
        self.leader_mark = None               # (gate, whether the first leader led, perf_counter, committed length,
        #                                       whether that step switched leader) at the last proposal: _leader
        self.full_rows = 0                    # the most rows this row's batch has run with: its full batch
        self.gate_mark = None                 # (gate, speculated, drafter gate, drafter allowed, perf_counter,
        #                                       batch_setup_s, committed length, rows, (first step of its mode, of its
        #                                       drafter mode)) at the last proposal

    def verify_cost(self, num_nodes: int) -> float:
        """This row's share of a verify forward with num_nodes nodes per row: the forward of
        batch_size rows is shared by them, while each row's drafting adds to the step alone. Within a
        proposal (step_costs) the profile's costs are read from a list made once per profile: a step's plans
        and judgements ask for them dozens of times, and the batch size, the profile and cost_scale hold
        until the step's observe."""
        step = self.step_costs
        if step is not None:
            scale, batch, listed = step
            if type(num_nodes) is int and 0 <= num_nodes < len(listed):    # a plan's mean size (a float) is interpolated
                return scale * listed[num_nodes] / batch
        return self._verify_cost(num_nodes)

    def _listed_costs(self, profile: CostProfile) -> list[float]:
        """profile.verify_cost(n) for n = 0 .. max_nodes, listed once per profile."""
        listed = self.listed_costs
        if listed is None or listed[0] is not profile:
            listed = self.listed_costs = (profile, [profile.verify_cost(n) for n in range(self.max_nodes + 1)])
        return listed[1]

    def _verify_cost(self, num_nodes: int) -> float:
        return self.cost_scale * self.costs_at(self.batch_size).verify_cost(num_nodes) / self.batch_size

    def propose(self, state: DecodeState) -> CandidateTree:
        if not self.propose_start(state):
            return self.propose_end(state, None, None)
        return self.propose_end(state, *self._draft(self.called, state))

    @staticmethod
    def _draft(slot: DrafterSlot, state: DecodeState) -> tuple[CandidateTree, float]:
        """(the slot's drafter's tree, seconds it took)."""
        started = time.perf_counter()
        tree = slot.drafter.propose(state)
        return tree, time.perf_counter() - started

    # the two phases of a proposal, apart so that a batch runs the drafters of all its rows together
    # (specdec.batch.propose_rows); propose() is the two with the drafter called in between
    def batch_drafter(self):
        """The drafter a batch may run for all its rows at once (the first drafter's: a draft model's chains),
        or None."""
        return None if self.drafter is None else self.drafter.batch_drafter()

    def propose_start(self, state: DecodeState) -> bool:
        """Lookup's paths and their plan; whether the first drafter is called this step. Another drafter that
        the step calls (self.called) drafts here, alone, and propose_end takes its tree (self.side)."""
        self.batch_size = state.batch_size
        self.started = None                   # what phase two needs (None: a plain step)
        self.called, self.side = None, None
        speculate, drafter_allowed = self._gate_modes(state)
        if not speculate:
            return False
        # verify_cost's prices for this proposal (until propose_end)
        self.step_costs = (self.cost_scale, self.batch_size, self._listed_costs(self.costs_at(self.batch_size)))
        self.step += 1
        paths, lookup_nodes = [], 0
        self.match_length = None
        if self.lookup is not None:
            paths, lookup_nodes = self.lookup.propose_paths(state), self.lookup.max_nodes
            self.match_length = self.lookup.match_length
        lookup_tree, lookup_source = merge_paths(CandidateTree.empty(self.device), paths, lookup_nodes)
        accept, keys = self._estimates(lookup_tree, lookup_source, state)
        lookup_keep, lookup_rate = plan(lookup_tree.parents, accept, self.verify_cost, 0.0, self.max_nodes,
                                        chain=self.chains)
        # greedy and sampled steps apart: lookup that copies right greedy mostly fails when sampling, so
        # a greedy request's plans must not keep the drafter uncalled on the sampled ones after it
        context = (temperature_key(state.sampling.temperature), _lookup_context(lookup_tree.parents, accept, lookup_keep))
        self.plan_without[context] = _ema_pair(self.plan_without.get(context),
                                               (lookup_rate * self.verify_cost(len(lookup_keep)), len(lookup_keep)))
        for slot in self.slots:
            slot.steps_since_call += 1
        self.started = (paths, lookup_nodes, lookup_tree, lookup_source, keys, lookup_keep, context, accept, lookup_rate)
        if not drafter_allowed:
            return False
        self.called = self._pick_slot(state, context)
        if self.called is None or self.called is self.slots[0]:
            return self.called is not None
        self.side = self._draft(self.called, state)
        return False

    def _pick_slot(self, state: DecodeState, context) -> DrafterSlot | None:
        """The drafter this step calls, if any: each is asked whether it pays against lookup alone (_call_drafter),
        and where more than one would be called, strategies/drafter_slots.pick chooses."""
        if len(self.slots) == 1 or state.batch_size > 1:
            # in a batch the first drafter alone: a batch drafts its rows' first drafter together (one EAGLE forward
            # per level for all rows), while rows that called another would draft it one by one and leave the first
            # to catch them up later (benchmarks/results/auto_drafters/README.md: the A/B at B = 4)
            return self.slots[0] if self._call_drafter(state, context) else None
        others = [slot for slot in self.slots if slot.drafter is not None]
        if self.explore_every > 1:            # 1: every drafter is called in turn (no gate: nothing is judged)
            first, leads = self._leader(state)
            if leads:
                return first if self._call_drafter(state, context, first) else None
            others = [slot for slot in others if slot is not first]
        wanted = [slot for slot in others if self._call_drafter(state, context, slot)]
        return pick(wanted, context, lambda slot: self.slot_rate(context, slot), self.explore_every,
                    MAX_EXPLORE_GAP, self.leaders)

    def _leader(self, state: DecodeState) -> tuple[DrafterSlot, bool]:
        """(the first leader's slot (drafter_slots.first_leader), whether this step runs auto with it alone rather
        than with the others, each judged against lookup alone and one picked per step: drafter_slots.pick). Which
        one is measured, not predicted: a gate per temperature kind (strategies/batch_gate.py, on one row) keeps
        whichever made more tokens per second of wall time over its recent steps, and looks at the other now and
        then. Per-step rates cannot choose: what a drafter's call makes depends on who led the steps before it
        (the table learns the rows of the trees it drafts; EAGLE catches up on the steps it did not draft), so
        the drafter that looks better step by step under one leader may run slower as the leader
        (benchmarks/results/auto_leader)."""
        first = first_leader(self.slots, state.sampling.greedy)
        if self._paired(state, first):
            return first, self._paired_leader(state, first)
        kind = temperature_key(state.sampling.temperature)
        gate = self.leader_gates.get(kind) or self.leader_gates.setdefault(
            kind, BatchGate(margin=0.0, memory=LEADER_MEMORY, probe_steps=LEADER_PROBE_STEPS, fresh_probes=True,
                             explore=LEADER_EXPLORE))
        now = time.perf_counter()
        leads = gate.mode(self.gate_row)
        switched = True                       # a call's first step (the drafter catches up on the prompt) or a switch
        if self.leader_mark is not None:
            last_gate, led, at, length, last_switched = self.leader_mark
            last_gate.record(led, len(state.token_ids) - length, now - at, 1, switch=last_switched)
            switched = led != leads
        self.leader_mark = (gate, leads, now, len(state.token_ids), switched)
        return first, leads

    def _paired(self, state: DecodeState, first: DrafterSlot) -> bool:
        """Whether this step's leader is judged on paired samples (strategies/paired_leader.py): greedy, on a CPU
        (reading the table is free there; on a GPU each read is a host sync), the first leader a table that can
        be read without a call (peek), against one other drafter."""
        return (state.sampling.greedy and state.noise is None and getattr(self.device, "type", self.device) == "cpu"
                and hasattr(first.drafter, "peek") and sum(slot.drafter is not None for slot in self.slots) == 2)

    def _paired_leader(self, state: DecodeState, first: DrafterSlot) -> bool:
        """Whether the table leads this step (strategies/paired_leader.py): the last step goes to the judge (the
        table's own, or the other drafter's with what the table's mode would have kept there, scored once that
        text is committed), then the judge decides. On a step the other drafter runs, and on some of the table's
        own, the table's mode's trees are kept for scoring: the table's (TokenRecycling.peek) and lookup's plan."""
        judge = self.paired_leaders.get("greedy") or self.paired_leaders.setdefault("greedy", PairedLeader())
        now = time.perf_counter()
        switched = True                       # a call's first step (a drafter catches up on the prompt) or a switch
        if self.paired_mark is not None:
            led, at, length, counted, trees = self.paired_mark
            tokens, seconds = len(state.token_ids) - length, now - at
            if counted:
                if led:
                    judge.record_table(tokens, seconds)
                if trees is not None:
                    self.paired_waiting.append((length, tokens, seconds, trees, led))
        self.paired_waiting, pairs = score_guesses(self.paired_waiting, state.token_ids)
        if pairs:
            judge.add_pairs(pairs)
        leads = judge.lead()
        if self.paired_mark is not None:
            switched = self.paired_mark[0] != leads
        # the table's mode's trees this step, scored once their text is committed: on each of the other drafter's
        # steps what the table would have kept there; on every PAIRED_BIAS_EVERY-th of the table's own, against
        # what it kept (the guesses' bias: a sample of them is enough, and a read of the table costs a little)
        self.paired_steps += 1
        trees = None
        if not leads or self.paired_steps % PAIRED_BIAS_EVERY == 0:
            table = first.drafter.peek(state)
            lookup_tree, lookup_keep = self.started[2], self.started[5]   # propose_start's (on a CPU: read for free)
            trees = ((lookup_tree.tokens.tolist(), lookup_tree.parents, lookup_keep),)
            if table is not None:
                trees += ((table[0], table[1], range(len(table[1]))),)
        # a step the token budget cuts short keeps at most what is left, whoever leads: not a rate's sample
        counted = not switched and state.max_depth >= PAIRED_FULL_DEPTH
        self.paired_mark = (leads, now, len(state.token_ids), counted, trees)
        return leads

    def slot_rate(self, context, slot: DrafterSlot) -> float | None:
        """A drafter's tokens/s in this context priced now, by what its calls made (measured_rates: its last calls
        here, or at this temperature kind while it made few here); None before MIN_CALLS_MEASURED calls. Plans
        do not rank drafters: a plan trusts a calibration whose prior favours whichever drafter has been called
        least, while the calls' tokens are what each did (and a few calls of each come soon: pick calls an
        unranked drafter first)."""
        measured = self.measured_rates(context, slot=slot)
        return None if measured is None else measured[0]

    def propose_end(self, state: DecodeState, neural_tree: CandidateTree | None,
                    drafted_s: float | None) -> CandidateTree:
        """The merged, planned tree, with the drafter's tree if it was called (it took drafted_s seconds)."""
        if self.started is None:
            return self._plain()
        if neural_tree is None and self.side is not None:
            neural_tree, drafted_s = self.side
        end_start = time.perf_counter()
        paths, lookup_nodes, lookup_tree, lookup_source, keys, lookup_keep, context, accept, _ = self.started
        lookup_alone = None
        slot = self.called
        if neural_tree is not None:
            slot.neural_calls += 1
            lookup_alone = (paths, lookup_nodes, lookup_keep)
            # a call after a gap (or the first of a generation) also catches the drafter up on the
            # tokens it missed: not what a call costs while it keeps drafting
            slot.steady_call = slot.steps_since_call <= 1
            slot.steps_since_call = 0
        else:
            neural_tree = CandidateTree.empty(self.device)
        forced = ()
        if not neural_tree.num_nodes:
            keep, tree, merged = lookup_keep, lookup_tree.select(lookup_keep), lookup_tree
        else:
            merged, source = merge_paths(neural_tree, paths, lookup_nodes + neural_tree.num_nodes)
            accept, keys = self._estimates(merged, source, state, slot.key, slot.drafter.chain_nodes)
            sampled = neural_tree.draft_probs is not None and not state.sampling.greedy and state.noise is None
            forced = range(neural_tree.num_nodes) if sampled or slot.drafter.verify_whole else ()
            draft_cost = slot.draft_cost_s or 0.0
            keep, rate = plan(merged.parents, accept, self.verify_cost, draft_cost, self.max_nodes, forced=forced,
                              chain=self.chains)
            slot.plan_with[context] = _ema_pair(slot.plan_with.get(context),
                                                (rate * (self.verify_cost(len(keep)) + draft_cost), len(keep)))
            tree = merged.select(keep)
            lookup_source = source
        self._trim_order(merged.parents, accept, keep, forced)
        # what calling the drafter cost this step: its propose, and merging and planning its tree
        self.last_draft_s = None if drafted_s is None else drafted_s + time.perf_counter() - end_start
        self.pending = _Step(merged, lookup_source, keys, keep, neural_tree, time.perf_counter(), context, lookup_alone,
                             slot)
        self.tree_sizes.append(tree.num_nodes)
        self.step_costs = None
        return tree

    # ------------------------------------------------------------------ a batch's width (strategies/batch_width.py)
    def _trim_order(self, parents: list[int], accept: list[float], keep: list[int], forced) -> None:
        """The kept nodes in the order a batch may cut them (trim): the forced ones first, then by reach
        (the planner's own order: every prefix is closed under parents), and their reach."""
        if self.batch_size <= 1:          # no batch to fit: nothing is cut, so no reach is needed
            self.trim_order, self.trim_reach, self.trim_forced = keep, [], len(keep)
            return
        forced = set(forced)
        reach = path_reach(parents, accept)
        self.trim_order = (sorted(node for node in keep if node in forced)
                           + sorted((node for node in keep if node not in forced), key=lambda i: (-reach[i], i)))
        self.trim_reach = [reach[node] for node in self.trim_order]
        self.trim_forced = len(forced)

    @staticmethod
    def fit_batch(rows: list["Auto"], trees: list[CandidateTree]) -> list[CandidateTree]:
        """The rows' trees cut to the one width that pays most for the whole batch's forward (called by
        specdec.batch.propose_rows with every row's strategy, in row order, after all rows proposed)."""
        planned = [row for row, tree in zip(rows, trees) if tree.num_nodes]
        if len(rows) < 2 or not planned:
            return trees
        scale = statistics.median(row.cost_scale for row in planned)
        costs = planned[0].costs_at(len(rows))
        drafting = sum(row.last_draft_s or 0.0 for row in planned)
        # every row's tokens count (a row with no tree this step still makes one)
        width = best_width([row.trim_reach if tree.num_nodes else [] for row, tree in zip(rows, trees)],
                           [row.trim_forced if tree.num_nodes else 0 for row, tree in zip(rows, trees)],
                           lambda n: scale * costs.verify_cost(n), drafting)
        return [row.trim(width) if tree.num_nodes > width else tree for row, tree in zip(rows, trees)]

    def trim(self, width: int) -> CandidateTree:
        """This step's tree cut to its `width` first nodes in trim order (never its forced ones)."""
        step = self.pending
        keep = sorted(self.trim_order[: max(width, self.trim_forced)])
        self.pending = step._replace(keep=keep)
        self.tree_sizes[-1] = len(keep)
        return step.merged.select(keep)

    def _gate_modes(self, state: DecodeState) -> tuple[bool, bool]:
        """In a batch: (whether this step speculates, whether it may call the drafter), from this batch
        size's gates, after giving them this row's last step (its new tokens over the wall time since its
        last proposal, less the time the batch spent starting prompts meanwhile: DecodeState.batch_setup_s).
        The first gate weighs speculation against plain decoding. With both lookup and a drafter, a second
        one weighs, on speculating steps, calling the drafter against lookup speculating alone: a batch
        pays its rows' drafter forwards one row after another, while lookup's copies cost next to nothing,
        so in a batch lookup alone may pay where lookup with the drafter does not."""
        if state.batch_size <= 1 or not self.use_batch_gate:
            self.gate_mark = None                 # a batch that shrank to one row: nothing to measure against
            return True, True
        now = time.perf_counter()
        key = (batch_bucket(state.batch_size), temperature_key(state.sampling.temperature))
        draining = state.batch_waiting == 0
        gate = self._gate(self.batch_gates, key)
        # first: a new step closes the last one's samples
        speculate = gate.mode(self.gate_row, draining=draining)
        drafter_gate = None
        if speculate and self.lookup is not None and self.drafter is not None:
            drafter_gate = self._gate(self.drafter_gates, key)
        drafter_allowed = True if drafter_gate is None else drafter_gate.mode(self.gate_row, draining=draining)
        switched = (True, True)                   # this step's modes differ from the row's last step's
        if self.gate_mark is not None:            # then this row's sample of the last step
            last_gate, speculated, last_drafter_gate, allowed, at, setup_at, length, rows, last_switched = self.gate_mark
            switched = (speculated != speculate, speculated != speculate or allowed != drafter_allowed)
            # a mode's first step pays for the switch (the drafter catches up on the tokens it skipped):
            # not the mode's rate (a probe would mostly be it), but part of what the probe cost; the
            # prompts the batch started meanwhile are neither mode's cost
            seconds = now - at - (state.batch_setup_s - setup_at)
            tokens, full = len(state.token_ids) - length, rows >= self.full_rows
            last_gate.record(speculated, tokens, seconds, rows, switch=last_switched[0], full=full)
            if last_drafter_gate is not None:
                last_drafter_gate.record(allowed, tokens, seconds, rows, switch=last_switched[1], full=full)
        self.full_rows = max(self.full_rows, state.batch_size)
        self.gate_mark = (gate, speculate, drafter_gate, drafter_allowed, now, state.batch_setup_s,
                          len(state.token_ids), state.batch_size, switched)
        return speculate, drafter_allowed

    def _gate(self, gates: dict, key: tuple) -> BatchGate:
        """The gate of `key` in `gates` (batch_gates or drafter_gates), made on first use."""
        return gates.get(key) or gates.setdefault(key, BatchGate(speculate_first=self._speculates_below(gates, key)))

    def _speculates_below(self, gates: dict, key: tuple) -> bool:
        """Whether, in `gates`, the mode that costs more (speculation; the drafter's calls) beat the other
        by the gate's margin at the largest smaller batch size (bucket) that measured both at this
        temperature kind (True where none did): a new batch size starts in that mode. Speculation, and a
        drafter's calls most, pay less as the batch grows (the verify forward turns compute-bound, and the
        rows' drafting adds up), so where it did not clearly pay at a smaller batch a larger one starts
        without it, not with steps it would lose."""
        bucket, kind = key
        below = [(size, gate) for (size, size_kind), gate in list(gates.items())
                 if size_kind == kind and size < bucket and gate.measured()]
        if not below:
            return True
        gate = max(below, key=lambda item: item[0])[1]
        return gate.beats(True, gate.rate(True), gate.rate(False))

    def _plain(self) -> CandidateTree:
        """A plain decoding step: no lookup, no drafter, no planning (what the gate measured faster)."""
        tree = CandidateTree.empty(self.device)
        for slot in self.slots:
            slot.steps_since_call += 1        # the drafter's next call catches up: not a steady call
        self.last_draft_s = None
        self.pending = _Step(tree, [], [], [], tree, time.perf_counter(), (None, 0))
        self.tree_sizes.append(0)
        self.step_costs = None
        return tree

    def finish(self, state: DecodeState) -> None:
        """The call has finished: parts that keep something of a finished call (suffix) keep it."""
        for part in (self.lookup, *self.drafters()):
            if part is not None:
                part.finish(state)

    def forget(self) -> None:
        """Its parts forget what they keep across calls (suffix's cache); calibration and costs stay."""
        for part in (self.lookup, *self.drafters()):
            if part is not None:
                part.forget()

    def drafting_modules(self) -> list:
        """The drafters' modules (auto's own attributes hold the target, which is not drafting)."""
        return [module for part in self.drafters() for module in part.drafting_modules()]

    def verifying_modules(self) -> list:
        return [module for part in self.drafters() for module in part.verifying_modules()]

    def observe(self, state: DecodeState, result: StepResult) -> None:
        merged, source, keys, keep, neural_tree, proposed_at, context, lookup_alone, called = self.pending   # a _Step
        elapsed = time.perf_counter() - proposed_at          # verify + acceptance + commit of this step
        predicted = self.costs_at(self.batch_size).verify_cost(len(keep))
        if predicted > 0 and self.adapt_costs:
            self.cost_scale = min(max(_ema(self.cost_scale, elapsed / predicted, 0.1), 0.2), 5.0)
        accepted = [keep[node] for node in result.accepted]  # indices in the merged tree
        for node in accepted:
            self.accepted_nodes[source[node]] += 1
        self._calibrate(merged, keys, keep, accepted)
        if lookup_alone is not None:
            self._record_call(state, result, len(keep), lookup_alone, context, called)
        if self.lookup is not None:           # the verified tree is auto's, not lookup's: lookup only indexes
            self.lookup.catch_up(state.token_ids)
        empty = None
        for slot in self.slots:               # every drafter sees every step (an uncalled one: plain steps)
            if slot.drafter is None:
                continue
            start = time.perf_counter()
            if slot is called:
                steps = drafter_steps(state, result, accepted, neural_tree, keep)
            else:
                empty = empty if empty is not None else CandidateTree.empty(neural_tree.tokens.device)
                steps = drafter_steps(state, result, accepted, empty)
            slot.drafter.observe_steps(state, steps)
            if slot is called and self.last_draft_s is not None and self.adapt_costs:
                self._time_call(slot, self.last_draft_s + time.perf_counter() - start)

    @staticmethod
    def _time_call(slot: DrafterSlot, spent: float) -> None:
        """Price the slot's calls by this one (`spent` seconds: its propose, observe, and merging and planning its
        tree). A call costs what it catches up on too: a drafter with a cache of its own (EAGLE) first feeds the
        rows committed since its last call, so where lookup alone takes some steps, or another drafter leads
        some contexts, its calls cost more than back-to-back ones. Pricing it at its back-to-back calls (their
        median, before) made it look cheaper than it ran (benchmarks/results/auto_leader). Left out: the
        generation's first call (the prompt's catch-up, paid once whatever the policy; it prices the slot only
        until another is timed) and looks (a look after a long gap catches up on far more than any call in the
        regime it looks from)."""
        if slot.first_call:
            slot.first_call = False
            if not slot.cost_known:
                slot.draft_cost_s = spent
        elif slot.reason != LOOK:
            slot.draft_times.append(spent)
            slot.draft_cost_s = call_cost(slot.draft_times)
            slot.cost_known = True

    # ------------------------------------------------------------------ policy
    # each of these judges one drafter (slot; None: the first) against lookup alone
    def planned_rates(self, context, slot: DrafterSlot | None = None) -> tuple[float | None, float]:
        """(planned tokens/s with the drafter or None before its first call, with lookup alone) in
        a lookup context: recent plans' expected new tokens over what their trees cost now."""
        slot = slot or self.slots[0]
        rate_with = rate_without = None
        if context in slot.plan_with:
            tokens, nodes = slot.plan_with[context]
            rate_with = tokens / (self.verify_cost(nodes) + (slot.draft_cost_s or 0.0))
        if context in self.plan_without:
            tokens, nodes = self.plan_without[context]
            rate_without = tokens / self.verify_cost(nodes)
        return rate_with, rate_without or 0.0

    def measured_calls(self, context, slot: DrafterSlot | None = None) -> list[tuple]:
        """The drafter's last calls in this context (call_values: tokens kept, nodes verified, tokens lookup alone
        would have kept, its nodes), or all its calls at the context's temperature kind while it has fewer than
        MIN_CALLS_MEASURED here."""
        slot = slot or self.slots[0]
        with slot.call_values_lock:
            values = list(slot.call_values.get(context, ()))
            if len(values) < MIN_CALLS_MEASURED:
                values = [value for key, kept in slot.call_values.items() if key[0] == context[0] for value in kept]
        return values

    def measured_rates(self, context, values: list[tuple] | None = None,
                       slot: DrafterSlot | None = None) -> tuple[float, float, float, float] | None:
        """What the drafter's last calls in this context did (`values`, else measured_calls), priced at the costs
        known now: (tokens/s of those steps, tokens/s lookup alone would have made on the same steps, seconds of
        such a step with the drafter, without it); None before MIN_CALLS_MEASURED calls."""
        slot = slot or self.slots[0]
        values = self.measured_calls(context, slot) if values is None else values
        if len(values) < MIN_CALLS_MEASURED:
            return None
        draft_cost = slot.draft_cost_s or 0.0
        cost = self._verify_costs(values)
        seconds_with = sum(cost[nodes] + draft_cost for _, nodes, _, _ in values)
        seconds_alone = sum(cost[nodes] for _, _, _, nodes in values)
        rate_with = sum(tokens for tokens, _, _, _ in values) / seconds_with
        rate_alone = sum(tokens for _, _, tokens, _ in values) / seconds_alone
        return rate_with, rate_alone, seconds_with / len(values), seconds_alone / len(values)

    def planned_loss(self, context, slot: DrafterSlot | None = None) -> float | None:
        """What one call of the drafter loses in this lookup context by its recent plans (planned_rates), in
        steps of lookup alone; None where it pays (or before its first call here)."""
        slot = slot or self.slots[0]
        rate_with, rate_without = self.planned_rates(context, slot)
        if rate_with is None or rate_with >= rate_without:
            return None
        seconds_with = self.verify_cost(slot.plan_with[context][1]) + (slot.draft_cost_s or 0.0)
        return (1.0 - rate_with / rate_without) * seconds_with / self.verify_cost(self.plan_without[context][1])

    def call_gains(self, context, values: list[tuple] | None = None, slot: DrafterSlot | None = None) -> list[float]:
        """Per measured call (`values`, else measured_calls), priced at the costs known now: the tokens it kept
        beyond what lookup alone would have made in the call's seconds (its tokens on that step, scaled by the
        call's seconds over its own). Their mean is below zero where the calls lose."""
        slot = slot or self.slots[0]
        draft_cost = slot.draft_cost_s or 0.0
        values = self.measured_calls(context, slot) if values is None else values
        cost = self._verify_costs(values)
        return [tokens - alone * (cost[nodes] + draft_cost) / cost[alone_nodes]
                for tokens, nodes, alone, alone_nodes in values]

    def _verify_costs(self, values: list[tuple]) -> dict:
        """verify_cost of each tree size the calls `values` verified or planned for lookup alone, each priced
        once: a drafter's last calls repeat a few sizes, and auto judges each drafter on them every step."""
        sizes = {value[1] for value in values} | {value[3] for value in values}
        return {nodes: self.verify_cost(nodes) for nodes in sizes}

    def measured_loss(self, context, slot: DrafterSlot | None = None, values: list[tuple] | None = None
                      ) -> float | None:
        """What one call of the drafter loses by what its last calls did (`values`, else measured_calls; through
        measured_rates), in steps of lookup alone; None where they paid, where they lost by less than their
        noise (clear_loss) or too few were made."""
        slot = slot or self.slots[0]
        if values is None:                  # read once: the rates and the gains judge the same calls
            values = self.measured_calls(context, slot)
        measured = self.measured_rates(context, values, slot)
        if measured is None or measured[0] >= measured[1] or not clear_loss(self.call_gains(context, values, slot)):
            return None
        rate_with, rate_alone, seconds_with, seconds_alone = measured
        return (1.0 - rate_with / rate_alone) * seconds_with / seconds_alone

    def _call_drafter(self, state: DecodeState, context, slot: DrafterSlot | None = None) -> bool:
        """Call the drafter where it pays: where neither its recent planned rate in this lookup context
        (planned_rates: a drafter that pays where lookup has nothing may not pay beside a long lookup match)
        nor what its last calls did there (measured_rates, beyond their noise: clear_loss) loses to lookup
        alone; a plan's loss does not count where the calls in this context clearly paid (clear_gain). Otherwise
        only look again, on the temperature kind's one schedule, after a gap that doubles each
        look, up to MAX_EXPLORE_GAP or, for a dear drafter, up to what keeps its looks to LOOK_SHARE of the time
        (priced_gap): a useless or dear drafter costs next to nothing, and one that starts paying comes back.
        A drafter that knows what a call would add without making it (expected_call: early_exit's shadow
        tokens) is not called, not even to look, where that loses to lookup alone (expected_loses), nor while
        that is about to be known; where it pays, the rules above decide. Why it says yes is kept in slot.reason
        (strategies/drafter_slots.py: which of several drafters a step calls)."""
        slot = slot or self.slots[0]
        slot.reason = None
        if slot.drafter is None or state.max_depth <= 0:
            return False
        if self.explore_every <= 1:                          # every step
            slot.reason = PAYS
            return True
        expected = slot.drafter.expected_call(state)
        if expected is not None and (expected.accept is None or self.expected_loses(expected)):
            return False       # known without a call, or soon: neither called nor looked at (no call teaches more)
        if slot.steps_since_call == 1 and not slot.steady_call:
            # the last step called after a gap (a catch-up, not what a call costs): call once more, so
            # every look times a steady call; else a cost once measured high would never be measured again
            slot.reason = STEADY
            return True
        with slot.call_values_lock:
            measured_here = len(slot.call_values.get(context, ())) >= MIN_CALLS_MEASURED
        values = self.measured_calls(context, slot)         # this context's own calls where measured_here
        # a plan is a forecast from calibrated estimates: where the calls in this context clearly paid, a plan
        # that says they lose is overruled (one that undervalued the table beside lookup's matches kept it
        # uncalled where its calls paid: benchmarks/results/auto_gate), as calls that clearly lost overrule a
        # plan that says they pay (measured_loss)
        paid = measured_here and clear_gain(self.call_gains(context, values, slot))
        planned = None if paid else self.planned_loss(context, slot)
        losses = [loss for loss in (planned, self.measured_loss(context, slot, values)) if loss is not None]
        if not losses:
            slot.reason = PAYS
            return True
        since, gap = slot.looks.get(context[0], (0, self.explore_every))
        since += 1
        if since < gap:
            slot.looks[context[0]] = (since, gap)
            return False
        slot.looks[context[0]] = (0, min(2 * gap, max(MAX_EXPLORE_GAP, priced_gap(max(losses)))))
        slot.reason = LOOK
        return True

    def expected_loses(self, expected: ExpectedCall) -> bool:
        """Whether this step's best tree with the drafter's expected call (its chain beside lookup's paths, the
        planner keeping what pays of it, its drafting at expected.cost plain verify forwards whatever is kept)
        makes fewer tokens/s by the planner than lookup's own plan. Optimistic for the drafter: its chain shares
        no node with lookup's paths, so their gains add."""
        _, _, lookup_tree, _, _, _, _, accept, lookup_rate = self.started
        first = lookup_tree.num_nodes
        chain = len(expected.accept)
        parents = list(lookup_tree.parents) + [first + i - 1 if i else -1 for i in range(chain)]
        _, rate = plan(parents, list(accept) + list(expected.accept), self.verify_cost,
                       expected.cost * self.verify_cost(0), self.max_nodes, chain=self.chains)
        return rate < lookup_rate

    def _record_call(self, state: DecodeState, result: StepResult, verified: int, lookup_alone: tuple,
                     context: tuple, slot: DrafterSlot | None = None) -> None:
        """Keep what a call did (call_values): the tokens this step kept over `verified` nodes, beside the
        tokens lookup's own plan (lookup_alone: its paths, node budget and kept nodes) would have kept."""
        paths, lookup_nodes, lookup_keep = lookup_alone
        before = result.committed_before
        committed = state.token_ids[before: before + result.num_accepted + 1]   # the accepted run, then the target's token
        tokens, parents = merge_into_trie([], [], paths, lookup_nodes)          # lookup's tree as propose_start built it
        alone = 1 + matched_length(tokens, parents, lookup_keep, committed)
        slot = slot or self.slots[0]
        with slot.call_values_lock:
            values = slot.call_values.setdefault(context, deque(maxlen=CALL_MEMORY))
            values.append((len(committed), verified, alone, len(lookup_keep)))

    def _node_keys(self, tree: CandidateTree, source: list[str], state: DecodeState, neural: str = NEURAL,
                   chain: Sequence[int] = (), ranks: tuple[list[int], list[bool]] | None = None) -> list[tuple]:
        """(calibration key, draft confidence or None) of every node; the drafter's nodes under its slot's
        name (`neural`: each drafter auto holds is calibrated apart), those its table chain added (`chain`:
        strategies/leaf_chain.py, the drafter's node indices, kept in the merged tree) under that name + "~chain":
        read from a table, not drafted, they are kept at rates of their own. Each key also holds the node's
        rank among its source's siblings and whether the other source drafted beside it (`ranks`: source_ranks's,
        computed here when not given)."""
        depths = tree.depths()
        confidence: list[float | None] = [None] * tree.num_nodes
        if self.sampled_confidence and tree.draft_probs is not None and tree.num_nodes:
            rows = tree.draft_probs.gather(1, tree.tokens.to(tree.draft_probs.device)[:, None])[:, 0]   # [N]
            confidence = [c if s == NEURAL else None for c, s in zip(rows.tolist(), source)]
        ranks, mixed = ranks or source_ranks(tree, source)
        marks = [("^" if mixed[i] else "") + "+" * min(ranks[i], MAX_RANK_KEY) for i in range(tree.num_nodes)]
        temperature = state.sampling.temperature
        names = {NEURAL: neural, LOOKUP: LOOKUP}
        chained = set(chain)
        keys = [(self.calibrator.key(f"{names[source[i]]}{'~chain' if i in chained else ''}{marks[i]}",
                                     temperature, confidence[i], depths[i]),
                 confidence[i]) for i in range(tree.num_nodes)]
        match = self.match_length
        if match:      # suffix's nodes: their own acceptance per match length (and depth), not prompt lookup's
            bucket = match_bucket(match)
            keys = [((f"suffix{marks[i]}", temperature_key(temperature), "match", bucket,
                      min(depths[i], self.calibrator.max_depth_key)), None) if source[i] == LOOKUP else keys[i]
                    for i in range(tree.num_nodes)]
        return keys

    def _estimates(self, tree: CandidateTree, source: list[str], state: DecodeState,
                   neural: str = NEURAL, chain: Sequence[int] = ()) -> tuple[list[float], list]:
        """(acceptance estimate of every node, its (key, confidence): what observe calibrates with)."""
        if not tree.num_nodes:
            return [], []
        keyed = self._keys_and_priors(tree, source, state, neural, chain)
        return [self.calibrator.estimate(key, conf, prior) for (key, conf), prior in keyed], [pair for pair, _ in keyed]

    def _keys_and_priors(self, tree: CandidateTree, source: list[str], state: DecodeState, neural: str,
                         chain: Sequence[int]) -> list[tuple[tuple, float]]:
        """((calibration key, draft confidence), prior estimate) of every node. Without confidences (greedy trees,
        lookup's, a table's) they follow from the tree's shape and sources alone, so they are kept per shape (a
        table's tree keeps its shape for many steps): a step then only reads the calibration."""
        confident = self.sampled_confidence and tree.draft_probs is not None
        shape = None
        if not confident:
            match = self.match_length
            shape = (tree.parents, tuple(source), neural, tuple(chain), temperature_key(state.sampling.temperature),
                     state.sampling.greedy, match_bucket(match) if match else None)
            known = self.keys_by_shape.get(shape)
            if known is not None:
                return known
        ranks = source_ranks(tree, source)
        keys = self._node_keys(tree, source, state, neural, chain, ranks)
        prior = PRIOR_ACCEPT if state.sampling.greedy else PRIOR_ACCEPT_SAMPLED
        # a later sibling of its own source is kept less often than the first: a drafter ranks its children, and
        # lookup's later matches are older ones (token_recycling's prior_accept falls the same way)
        keyed = [(pair, prior[src][min(depth, 1)] / (1 + min(rank, MAX_RANK_KEY)) ** 2)
                 for pair, src, depth, rank in zip(keys, source, tree.depths(), ranks[0])]
        if shape is not None:
            if len(self.keys_by_shape) >= SHAPES_KEYED:
                self.keys_by_shape.clear()
            self.keys_by_shape[shape] = keyed
        return keyed

    def _calibrate(self, merged: CandidateTree, keys: list, keep: list[int], accepted: list[int]) -> None:
        """Every verified node whose parent was kept was tried: record whether it was kept. (`keep`
        is closed under parents: the planner's choice; keys: the nodes' from propose.)"""
        kept = set(accepted)
        for node in keep:
            parent = merged.parents[node]
            if parent == -1 or parent in kept:
                self.calibrator.record(keys[node][0], node in kept)


def source_ranks(tree: CandidateTree, source: Sequence[str]) -> tuple[list[int], list[bool]]:
    """([N] each node's rank among its siblings of the same source (mixed.merge_paths puts the drafter's
    children first, then lookup's), [N] whether a sibling of the other source stands beside it): what its
    acceptance is calibrated by, beside its depth. Where lookup and the drafter disagree on a token, each is
    right less often than where it drafts alone."""
    rank, mixed = [0] * tree.num_nodes, [False] * tree.num_nodes
    for group in (tree.children(p) for p in range(-1, tree.num_nodes)):
        seen: dict[str, int] = {}
        for node in group:
            rank[node] = seen.get(source[node], 0)
            seen[source[node]] = rank[node] + 1
        if len(seen) > 1:
            for node in group:
                mixed[node] = True
    return rank, mixed


def drafter_steps(state: DecodeState, result: StepResult, accepted: list[int],
                  neural_tree: CandidateTree, merged_kept: Sequence[int] = ()) -> list[StepResult]:
    """The step as the drafter sees it, in StepResults that keep StepResult's promise (`accepted`
    indexes the result's tree, `hidden` holds the rows of exactly the pending token and those nodes):
    the verdict on its own tree - the leading part of the accepted path (`accepted`: merged indices)
    made of its nodes, which keep their indices in the merged tree (strategies/mixed.py), with those
    nodes' rows and the target's token after them - then one plain step (an empty tree) per token
    committed after that part (lookup's accepted nodes and the target's last token), each with the
    row that produced it. A drafter that keeps state per committed row (eagle's features, medusa's
    last row) sees every row once, in order. A drafter with top_k_ids gets the rows' top-k (top_ids,
    input_ids): in the first step those of the pending token and of its own nodes that auto verified
    (merged_kept: the merged nodes verified, ascending; the drafter's come first), in each later step
    its one row. The first step says which of its nodes were verified (StepResult.verified): auto may have
    kept part of its tree."""
    own = 0                                  # merged nodes below the drafter's come after its own on a path
    while own < len(accepted) and accepted[own] < neural_tree.num_nodes:
        own += 1
    before = result.committed_before
    run = state.token_ids[before: before + len(accepted) + 1]    # the accepted tokens, then next_token
    hidden = result.hidden                                       # [1 + len(accepted), F] or None

    def rows(start: int, stop: int):
        return None if hidden is None else hidden[start:stop]

    def top(start: int, stop: int):
        """(top_ids, input_ids) of the verified tree's rows start..stop (None without them)."""
        if result.top_ids is None:
            return None, None
        return result.top_ids[start:stop], result.input_ids[start:stop]

    verified = tuple(node for node in merged_kept if node < neural_tree.num_nodes)
    steps = [StepResult(neural_tree, tuple(accepted[:own]), run[own], before, rows(0, own + 1),
                        *top(0, 1 + len(verified)), verified=verified)]
    empty = CandidateTree.empty(neural_tree.tokens.device)
    for k in range(own + 1, len(run)):      # run[k] was produced by the row of the node holding run[k - 1]
        row = 1 + result.accepted[k - 1]     # that node's row in the verified tree
        steps.append(StepResult(empty, (), run[k], before + k, rows(k, k + 1), *top(row, row + 1)))
    return steps


def priced_gap(loss: float) -> int:
    """Steps between looks at a drafter whose call loses `loss` steps of lookup alone (Auto.planned_loss,
    Auto.measured_loss) for its looks to cost at most LOOK_SHARE of the time, up to MAX_PRICED_GAP."""
    return min(math.ceil(LOOK_CALLS * loss / LOOK_SHARE), MAX_PRICED_GAP)


def clear_loss(gains: Sequence[float]) -> bool:
    """Whether calls with these gains (Auto.call_gains: tokens each kept beyond lookup alone in its time) lose
    beyond their noise: their mean lies more than MEASURED_MARGIN standard errors of it below zero. Calls that
    all gained the same (a drafter that never drafts the target's tokens) have no spread: any loss is clear."""
    mean, error = _mean_and_error(gains)
    return mean + MEASURED_MARGIN * error < 0


def clear_gain(gains: Sequence[float]) -> bool:
    """Whether calls with these gains pay beyond their noise: their mean lies more than MEASURED_MARGIN standard
    errors of it above zero (clear_loss's mirror)."""
    mean, error = _mean_and_error(gains)
    return mean - MEASURED_MARGIN * error > 0


def _mean_and_error(gains: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of one or more gains (0 error for one)."""
    # in floats: statistics.stdev sums exact fractions, and auto asks this of each drafter every step
    count = len(gains)
    mean = math.fsum(gains) / count
    error = math.sqrt(math.fsum((gain - mean) ** 2 for gain in gains) / (count - 1) / count) if count > 1 else 0.0
    return mean, error


def _lookup_context(parents, accept, keep) -> int:
    """What lookup offers this step, as a context for the drafter's decision: 0 nothing, 1 an
    expected gain under one token, 2 more (expected accepted lookup tokens = sum of path reach)."""
    if not keep:
        return 0
    reach = path_reach(parents, accept)
    return 1 if sum(reach[i] for i in keep) < 1.0 else 2


def pick_drafter(cfg) -> str | None:
    """Which drafter auto runs: auto.drafter, else the first of eagle / medusa / draft_model whose path
    is given, else token_recycling (it needs no training: the target's own top-k table); None ("none")
    for lookup alone."""
    if cfg.auto.drafter is not None:
        return None if cfg.auto.drafter == "none" else cfg.auto.drafter
    for name, path in (("eagle", cfg.eagle.path), ("medusa", cfg.heads.path), ("draft_model", cfg.draft.path)):
        if path:
            return name
    return "token_recycling"


# the first drafters auto.more_drafters: null holds the table beside. Each costs a step real time (a forward per
# level), while the target's own top-k table drafts for nearly nothing and, on a target the drafter fits poorly
# (a small one, where a drafter forward is a large share of a target forward), drafts better: auto then calls
# the table where its calls make more tokens/s (benchmarks/results/auto_drafters/README.md)
TABLE_BESIDE = ("draft_model", "medusa", "eagle")


def more_drafter_names(cfg, first: str | None) -> list[str]:
    """The drafters auto holds beside its first (`first`, pick_drafter's): auto.more_drafters, or where that is
    null the table beside a trained drafter (TABLE_BESIDE)."""
    if first is None:
        return []
    if cfg.auto.more_drafters is not None:
        return list(cfg.auto.more_drafters)
    return ["token_recycling"] if first in TABLE_BESIDE else []


def from_config(cfg, target, tokenizer, device, dtype) -> Auto:
    import importlib
    lookup_from_config = importlib.import_module(f"specdec.strategies.{cfg.auto.lookup_with}").from_config
    name = pick_drafter(cfg)
    names = [] if name is None else list(dict.fromkeys([name, *more_drafter_names(cfg, name)]))   # each held once
    # by name (no target) only token_recycling is built: it needs no model, only a table
    drafters = [importlib.import_module(f"specdec.strategies.{one}").from_config(cfg, target, tokenizer, device, dtype)
                for one in names if target is not None or one == "token_recycling"]
    drafter = drafters[0] if drafters and (target is not None or name == "token_recycling") else None
    a = cfg.auto
    lookup = lookup_from_config(cfg, target, tokenizer, device, dtype) if a.lookup else None
    return Auto(lookup, drafter, max_nodes=a.max_nodes,
                explore_every=a.explore_every, calibration_prior=a.calibration_prior, profile=a.profile,
                profile_context=a.profile_context, profile_repeats=a.profile_repeats, sampled_confidence=a.sampled_confidence,
                batch_gate=a.batch_gate, more_drafters=drafters[1:] if drafter is not None else [])
