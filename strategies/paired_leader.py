"""Which drafter leads auto's greedy steps on one sequence, judged on the same stretch of text: the
token-recycling table (auto's first leader at greedy) against one trained drafter (EAGLE), where the table
can be read for free.

auto's leader gate (strategies/batch_gate.py, Auto._leader) times each leader on the steps it led and
compares the two rates. On one sequence those steps lie on different stretches of text, and one leader's
rate moves by 2x from one 8-step stretch to the next, more than the 10-30% between leaders that the gate
must tell apart: a look landing on an easy stretch took the lead from a faster leader, and looks at the
table kept landing on a call's hard first steps (benchmarks/results/auto_look). Here the table is read on
every step the other drafter runs, without verifying it (TokenRecycling.peek: a gather, no forward), and
scored once the text it guessed is committed: how many tokens a step of the table's mode (the table's tree
beside lookup's paths) would have kept there. Its seconds per step are what its own steps took. So every
step the other drafter runs is a paired sample of both leaders on the same text:

  * while the other drafter leads, the table takes the lead back as soon as its paired rate over the last
    `memory` such steps beats the drafter's by `margin`;
  * while the table leads, the other drafter is looked at for `probe_steps` steps now and then (the gap
    doubling while looks lose, as the gate does), and takes the lead if its rate beats the table's paired
    rate over the look's own steps by `margin`, judged once those steps are scored (the table leads
    meanwhile; a look whose steps are not scored in time, a call having ended, gets no verdict);
  * while the other leads, the table runs `probe_steps` steps now and then, so that its seconds per step
    stay current.

Only greedy steps (a sampled step's tokens are a draw, not a function of the text) and only where reading
the table costs no device sync (a CPU): elsewhere auto keeps its gate."""
from __future__ import annotations

import statistics
import threading
from collections import deque
from typing import Sequence

from specdec.tree import depths_of


def matched_length(tokens: Sequence[int], parents: Sequence[int], keep: Sequence[int], committed: Sequence[int]) -> int:
    """Nodes of the part `keep` (closed under parents) of a point-mass tree that the committed tokens walk
    down from the root: what verifying that part alone would have accepted on the step. Exact when greedy or
    coupled; under rejection sampling, the same in expectation (a point mass is kept with the probability
    the target gives its token). At most len(committed): the target's tokens after the step are not known."""
    child = {(parents[node], tokens[node]): node for node in keep}
    parent = -1
    for length, token in enumerate(committed):
        parent = child.get((parent, token))
        if parent is None:
            return length
    return len(committed)


# a look's pairs are waited for this many times its steps (a guess is scored some steps after it, once its text is
# committed); then it is judged on those scored, or not at all below min_pairs
JUDGING_STEPS = 3


class PairedLeader:
    """The table's lead against one other drafter, decided on paired samples (module docstring). Shared by a
    Speculator's calls, as auto's gates are; each call keeps its own guesses waiting for their text
    (score_guesses)."""

    def __init__(self, memory: int = 24, min_pairs: int = 4, margin: float = 0.1, probe_steps: int = 6,
                 gap: int = 8, max_gap: int = 256, table_memory: int = 24):
        if probe_steps - 1 < min_pairs:        # a look's first step (a switch) is not counted: no look could be judged
            raise ValueError(f"probe_steps ({probe_steps}) must exceed min_pairs ({min_pairs})")
        self.memory, self.min_pairs, self.margin = memory, min_pairs, margin
        self.probe_steps, self.base_gap, self.max_gap = probe_steps, gap, max_gap
        self.table_leads = True               # the leader now (the table first: it is read for free)
        self.looking = False                  # the one not leading runs a look
        self.judging = False                  # a look at the other drafter ended: its pairs are being scored
        self.steps = 0                        # steps since the lead or the look changed
        self.gap = gap                        # the table's steps before the next look
        # (tokens, seconds) of the table's own counted steps: its seconds per step
        self.table_steps: deque = deque(maxlen=table_memory)
        # (the other's tokens, its seconds, the table's mode's tokens there) per counted step the other ran
        self.pairs: deque = deque(maxlen=memory)
        self.look_pairs: list[tuple[int, float, int]] = []
        self.guesses: deque = deque(maxlen=table_memory)   # (tokens kept, tokens guessed) of the table's own steps
        self._lock = threading.RLock()            # lead() reads the rates under it

    def record_table(self, tokens: int, seconds: float) -> None:
        """A counted step the table led (not a switch's or a call's first, nor one the token budget cut)."""
        if seconds > 0:
            with self._lock:
                self.table_steps.append((tokens, seconds))

    def add_pairs(self, pairs: Sequence[tuple]) -> None:
        """Scored steps (score_guesses): the other drafter's are pairs of both leaders on one stretch; the table's
        own say how far the guesses are from what the table's steps keep (guess_bias)."""
        with self._lock:
            for tokens, seconds, kept, table_led in pairs:
                if table_led:
                    self.guesses.append((tokens, kept))
                    continue
                self.pairs.append((tokens, seconds, kept))
                if self.table_leads and (self.looking or self.judging):
                    self.look_pairs.append((tokens, seconds, kept))

    def guess_bias(self) -> float:
        """What the table's steps kept over what their guesses said they would (1 before a few): a guess takes
        the table's whole tree and lookup's whole plan, where auto's plan of the two together keeps part of
        them, and the table is not called on every step."""
        with self._lock:
            guesses = list(self.guesses)
        if len(guesses) < self.min_pairs:
            return 1.0
        return sum(tokens for tokens, _ in guesses) / max(1, sum(kept for _, kept in guesses))

    def table_seconds(self) -> float | None:
        """The table's seconds per counted step of its own, their median (a stalled step is no step's price;
        None before 3)."""
        with self._lock:
            steps = list(self.table_steps)
        return statistics.median(seconds for _, seconds in steps) if len(steps) >= 3 else None

    def paired_rates(self, pairs: Sequence[tuple[int, float, int]]) -> tuple[float, float] | None:
        """(the other's tokens/s, the table's on the same steps) over `pairs`; None below min_pairs or before the
        table's step time is known."""
        per_step = self.table_seconds()
        if per_step is None or len(pairs) < self.min_pairs:
            return None
        seconds = sum(seconds for _, seconds, _ in pairs)
        if seconds <= 0:
            return None
        other = sum(tokens for tokens, _, _ in pairs) / seconds
        table = self.guess_bias() * sum(kept for _, _, kept in pairs) / (per_step * len(pairs))
        return other, table

    def lead(self) -> bool:
        """Whether the table runs this step (it leads and is not being looked away from, or the other leads and
        the table is being looked at), from the samples so far."""
        with self._lock:
            self.steps += 1
            if self.judging:                     # a look's pairs: all of them scored, or as many as came in time
                if len(self.look_pairs) < self.probe_steps - 1 and self.steps < JUDGING_STEPS * self.probe_steps:
                    return self.table_leads
                rates = self.paired_rates(self.look_pairs)   # None: too few scored (a call ended), no verdict
                self.judging, self.steps = False, 0
                if rates is not None and rates[0] > rates[1] * (1 + self.margin):
                    # the look's pairs are the other's record now: older ones may describe a table since warmed
                    self.table_leads = False
                    self.pairs = deque(self.look_pairs, maxlen=self.memory)
                elif rates is not None:
                    self.gap = min(2 * self.gap, self.max_gap)
            elif not self.looking:
                if self.table_leads:
                    if self.steps >= self.gap and len(self.table_steps) >= 3:
                        self.looking, self.steps, self.look_pairs = True, 0, []
                elif self._table_wins(list(self.pairs)):
                    self.table_leads, self.steps = True, 0   # the gap stays: looks stay as rare as they were
                elif self.steps >= self.gap:     # the table's own steps again: its seconds per step kept current
                    self.looking, self.steps = True, 0
            elif self.table_leads:               # a look at the other drafter
                if self.steps >= self.probe_steps:
                    # its last guesses are scored a few steps on, once their text is committed: the table leads
                    # meanwhile, and the look is judged then (judging)
                    self.looking, self.judging, self.steps = False, True, 0
            elif self.steps >= self.probe_steps:  # a look at the table, for its seconds per step
                self.looking, self.steps = False, 0
                if self._table_wins(list(self.pairs)):
                    self.table_leads = True
                else:
                    self.gap = min(2 * self.gap, self.max_gap)
            return self.table_leads != self.looking

    def _table_wins(self, pairs: list[tuple[int, float, int]]) -> bool:
        rates = self.paired_rates(pairs)
        return rates is not None and rates[1] > rates[0] * (1 + self.margin)


def score_guesses(waiting: list[tuple], token_ids: Sequence[int]) -> tuple[list[tuple], list[tuple]]:
    """(the guesses still waiting, the pairs of those whose text is now committed). A waiting guess is (start: where
    its step's new tokens begin in token_ids, the tokens the step kept, its seconds, the table's mode's trees there
    as (tokens, parents, kept nodes), whether the table led it); its pair is (tokens, seconds, what the table's mode
    would have kept: 1 + the longest part of a tree that the committed text walks down, whether the table led)."""
    still, pairs = [], []
    for start, tokens, seconds, trees, table_led in waiting:
        # a guess keeps at most its kept part's depth, then the target's own token (whatever it is): its text is
        # known once that many tokens are committed
        depth = max((_depth(parents, keep) for _, parents, keep in trees), default=0)
        if len(token_ids) < start + depth:
            still.append((start, tokens, seconds, trees, table_led))
            continue
        committed = token_ids[start: start + depth]
        kept = 1 + max((matched_length(t, p, keep, committed) for t, p, keep in trees), default=0)
        pairs.append((tokens, seconds, kept, table_led))
    return still, pairs


def _depth(parents: Sequence[int], keep: Sequence[int]) -> int:
    """Levels of the part `keep` of a tree given by its parents (-1: below the pending token)."""
    depth = depths_of(parents)           # cached per shape: a waiting guess is measured again every step
    return max((depth[node] + 1 for node in keep), default=0)
