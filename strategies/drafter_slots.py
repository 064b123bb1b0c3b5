"""What auto keeps per drafter it holds, and which one a step calls.

auto may hold more than one drafter (auto.more_drafters: a trained EAGLE beside the target's own
token-recycling table). Each is judged against lookup alone exactly as a single drafter is
(Auto._call_drafter: its planned rates, what its calls kept, its looks), on its own records: a
DrafterSlot. A step calls at most one of them (every drafter still observes every step, so a table
or a drafter's features stay current). On one sequence, Auto._leader's gate first decides whether the
step runs auto with its first leader alone (first_leader: at greedy the table) or with the others; among
the others (and in a batch, where the first drafter alone is called) `pick`'s rule below chooses.
Drafters that each pay against lookup alone are ranked by the tokens/s their measured calls made in the
step's lookup context (each is called a few times first, to be measured); the first drafter leads until
another beats it by SWITCH_MARGIN, and the others are called only on their own look schedule (gap
doubling, as for a drafter that loses to lookup alone), so a drafter that starts winning by that much
takes over. A call is priced at what calls cost (call_cost), catch-ups included.
"""
from __future__ import annotations

import copy
import statistics
import threading
from collections import deque

# a drafter's last calls whose mean, stalls left out, is its cost (call_cost): one slow call (the OS, a
# collection) must not price the drafter out, because a drafter that looks dear is called only on looks, far apart
DRAFT_TIMES = 9
STALL_FACTOR = 3.0

# why Auto._call_drafter would call a drafter this step, in the order a step honours them when
# several drafters would be called: the second call after a gap (a steady call, timed, that a look
# needs), a look at a drafter that loses (rare, spaced by what it loses), then a drafter that pays
STEADY, LOOK, PAYS = "steady", "look", "pays"
# a context's leading drafter hands over only to one whose rate beats its own by this factor: switching has
# a price the rates leave out (a drafter called after others' steps first catches up on the tokens it missed:
# EAGLE runs its features over them), and two drafters that draft about as well would otherwise trade the lead
# on every noisy measurement, paying that price each time
SWITCH_MARGIN = 1.15


class DrafterSlot:
    """One drafter auto holds and what auto learns of it. The dicts (plans, calls, looks) are shared by a
    Speculator's overlapping calls (what auto learns across calls); the scalars evolve per call."""

    def __init__(self, drafter, key: str, draft_cost_s: float | None = None):
        self.drafter = drafter               # a BaseStrategy, or None (auto with lookup alone)
        self.key = key                       # its nodes' calibration name ("neural" for the first drafter)
        # planned (expected new tokens, nodes verified) of recent steps calling it, per lookup context
        self.plan_with: dict[tuple, tuple[float, float]] = {}
        # per context, its last calls as (tokens the step kept, nodes verified, tokens lookup alone would
        # have kept on that step, the nodes it had planned): Auto.measured_rates
        self.call_values: dict[tuple, deque] = {}
        self.call_values_lock = threading.Lock()
        # per temperature kind, (steps since the last look, gap before the next): looks while it loses to
        # lookup alone; rival_looks the same per lookup context, while it pays there but another drafter pays more
        # (per context: drafters may lead in different ones, and a lead in one must not restart the others' gaps)
        self.looks: dict[str, tuple[int, int]] = {}
        self.rival_looks: dict[tuple, tuple[int, int]] = {}
        self.draft_cost_s = draft_cost_s     # seconds a call adds to a step, measured as it runs
        self.cost_known = draft_cost_s is not None     # draft_cost_s is given, or timed on calls (not the first)
        self.draft_times: deque = deque(maxlen=DRAFT_TIMES)
        self.first_call = True               # no call of this generation yet (its first catches up on the prompt)
        self.neural_calls = 0
        self.steps_since_call = 0
        self.steady_call = False
        self.reason: str | None = None       # why _call_drafter said yes at this step (STEADY, LOOK, PAYS)

    def for_call(self, drafter) -> "DrafterSlot":
        """This slot for a call that overlaps another: its per-call `drafter`, its own timings; plans, calls
        and looks shared."""
        twin = copy.copy(self)
        twin.drafter = drafter
        twin.draft_times = deque(self.draft_times, maxlen=DRAFT_TIMES)
        return twin


def call_cost(times) -> float:
    """What a drafter's call costs, from its last calls' seconds: the mean of those within STALL_FACTOR of their
    median. A catch-up's cost belongs in the mean (one is a few back-to-back calls' worth); a stall does not
    (the OS, a collection), nor a cost measured in a busy minute, once most calls since are timed lower."""
    middle = statistics.median(times)
    kept = [t for t in times if t <= STALL_FACTOR * middle]
    return sum(kept) / len(kept)


def first_leader(slots: list[DrafterSlot], greedy: bool) -> DrafterSlot:
    """The slot of the drafter auto runs alone while its leader gate says so (Auto._leader), against the others
    (picked step by step: pick): at greedy the first that leads_greedy (a table read, next to free), else the
    first auto holds (the one auto.drafter names). The gate starts with it."""
    held = [slot for slot in slots if slot.drafter is not None]
    if greedy:
        for slot in held:
            if slot.drafter.leads_greedy:
                return slot
    return held[0]


def pick(wanted: list[DrafterSlot], context: tuple, rate, explore_every: int, max_gap: int,
         leaders: dict) -> DrafterSlot | None:
    """The one slot a step calls among those Auto._call_drafter would call (`wanted`, in the order auto holds
    them, each with its reason): one whose reason ranks first (STEADY, LOOK, then PAYS); among paying ones, one
    whose rate(slot) is not known yet (None: too few calls; the least called of them), else the context's
    leader (leaders: context -> slot key, shared by calls; at first the first slot), which hands over to the
    best by rate(slot) only where that beats it by SWITCH_MARGIN; each other paying slot is called on its own
    look schedule in this lookup context (rival_looks: the gap doubles up to max_gap while it stays behind,
    and starts again from explore_every once it leads)."""
    if len(wanted) <= 1:
        return wanted[0] if wanted else None
    for reason in (STEADY, LOOK):
        first = next((slot for slot in wanted if slot.reason == reason), None)
        if first is not None:
            return first
    rates = [rate(slot) for slot in wanted]
    unknown = [slot for slot, value in zip(wanted, rates) if value is None]
    if unknown:                           # the least called first: each unranked drafter gets its calls soon
        return min(unknown, key=lambda slot: slot.neural_calls)
    best = max(range(len(wanted)), key=lambda i: rates[i])
    # the first leader is the first drafter in the order auto holds them, so that a drafter added beside it takes
    # steps only where it clearly drafts better, not by leading first
    leader = next((i for i, slot in enumerate(wanted) if slot.key == leaders.get(context, wanted[0].key)), None)
    if leader is not None and rates[best] < SWITCH_MARGIN * rates[leader]:
        best = leader
    if leader is not None or context not in leaders:
        # a leader that does not pay this step (it loses to lookup alone here, for now) keeps the lead: the
        # step calls the best that pays, which takes over only by beating the leader where both are called
        leaders[context] = wanted[best].key
    wanted[best].rival_looks[context] = (0, explore_every)
    due = None
    for i, slot in enumerate(wanted):
        if i == best:
            continue
        since, gap = slot.rival_looks.get(context, (0, explore_every))
        since += 1
        if due is None and since >= gap:
            due, since, gap = slot, 0, min(2 * gap, max_gap)
        slot.rival_looks[context] = (since, gap)
    return due if due is not None else wanted[best]
