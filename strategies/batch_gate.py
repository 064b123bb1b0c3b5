"""Whether `auto` speculates at all in a batch of B rows, and whether it calls its drafter there:
measured, not predicted. One gate of this class per (batch size bucket, temperature kind) weighs
speculation against plain decoding; with both lookup and a drafter, a second one weighs, on the
speculating steps, the drafter's calls against lookup speculating alone (Auto._gate_modes). Below,
"speculation" is the costlier mode of either gate.

In a batch every row's tree widens ONE forward: the forward is [B, 1 + the largest tree], so a row
that drafts 8 nodes makes the 15 others pay for them, and as B grows the forward turns compute-bound
(a node costs about as much as a row). Each row also drafts and plans on its own, row after row, in
Python. The per-row planner (strategies/planner.py) sees its own share of the verify cost only; what
a step of the whole batch costs with speculation on, against plain decoding, is what the gate
measures: the batch's new tokens per second of wall time, each step, with speculation on and with it
off, at each (batch-size bucket, greedy or sampled), and it keeps the faster (speculation only
when it is faster by MARGIN: its costs outside the measured steps). The time charges
everything a row costs: the draft model's forwards, lookup, planning, the padding of the forward.

vLLM picks a draft length per batch size from offline tuning; here the choice is made online, like
auto's drafter choice: the gate keeps its mode and looks at the other one for `probe_steps` steps
after `gap` steps, the gap doubling (up to `max_gap`) while the other mode keeps losing. A probe that
loses costs more than its steps' rate says: its first step pays for the switch (the drafter catches
up on every token it skipped, and is not counted in the mode's rate), and where speculation loses
(a large batch: the verify forward is compute-bound) a speculating step costs several plain ones. So
the gate also measures what each losing probe cost - its steps' wall time, the switch included,
less the time the best mode would have taken for the tokens they made - and waits until it has
run `1 / explore` times that long in the best mode before the next probe: looking around costs at
most about `explore` of the time, whatever a probe costs (but for the look after a first look that
switched, with `fresh_probes`: the first mode's steps before it were its coldest). A row's
sample is its new tokens over the wall time since its last proposal (one batch step, its forward and
every row's drafting and settling), less the time the batch spent starting new prompts meanwhile
(their prefill is paid whatever the mode; speculation spreads the rows' ends over many steps where
plain decoding ends them together, so counting it would charge speculation for it). A step's sample
is the batch's tokens over the step's seconds, and a mode's rate is the tokens over the seconds of its
recent steps, steps stalled past STALL times the median step left out: not the median of the steps'
rates, which sits below the mean rate where the tokens per step are skewed (speculation: a step keeps
one token or a whole chain), and so favoured plain decoding, whose every step makes one token a row.

A call's drain (no prompt left waiting: its rows only finish) is where a look at speculation costs
more than its steps: plain decoding ends rows of equal budgets at the same step, and a few speculating
steps leave them ragged (each row a different number of tokens ahead), so the call waits for its
slowest row in an ever emptier batch. A look at speculation counts all of its rows' tokens, while the
call ends no sooner unless every row gained. So while plain decoding is best, the gate looks at
speculation only while prompts wait (a row that ends early then frees its slot for the next prompt),
or once, where it never measured it. Looking at plain decoding costs no raggedness, so it may look at
plain decoding anywhere.

A mode's rate is measured on steps of the full batch only. In a drain's last steps the batch has
fewer rows, so a step makes fewer tokens for nearly the same forward; whichever mode ran there would
look slower, and speculation leaves the rows ragged there while plain decoding ends them together.

The mode changes only between batch steps (a row's second proposal under the same mode starts a new
step), so all rows of a step speculate or none: one row's tree would widen the forward for all.
Greedy identity and the target's law do not depend on the mode: a plain step is an empty tree.
"""
from __future__ import annotations

import statistics
import threading
from collections import deque

STALL = 3.0      # a step that took this many times a mode's median step stalled (the OS, a collection)
# what speculation must make beyond plain decoding's rate to be kept: it has costs outside the steps
# the gate measures. Its rows end at different steps, so a list's last rows drain in ever smaller
# batches (plain decoding ends rows of equal budgets together), and each new row's drafter catches
# up on its whole prompt in a speculating step (a stall the rate leaves out). Where the two modes'
# steps tie (benchmarks/results/batch/README.md has where, on a CPU), those costs decide.
MARGIN = 0.05


class BatchGate:
    """One batch size's (bucket's) choice between speculating and plain decoding."""

    def __init__(self, probe_steps: int = 4, gap: int = 8, max_gap: int = 256, memory: int = 16,
                 explore: float = 0.02, first_samples: int | None = None, margin: float = MARGIN,
                 speculate_first: bool = True, fresh_probes: bool = False):
        self.probe_steps, self.base_gap, self.max_gap, self.explore = probe_steps, gap, max_gap, explore
        self.margin = margin
        # a look at the other mode forgets that mode's old steps: where the modes' own state changes how fast
        # they run (auto's leaders: the table learns from every verify, a drafter's first calls are cold), steps
        # from a hundred steps back describe a mode that is gone, and kept in its rate they outweigh the look's
        # few (benchmarks/results/auto_leader: the table's cold first call kept EAGLE leading for 11 calls); and
        # what the first mode lost at the first look, on those cold steps, is not charged to its next look
        self.fresh_probes = fresh_probes
        # counted steps of the first mode before the other is looked at: a call's first steps (the drafter
        # catching up on whole prompts, a warm-up call of a few tokens) are its slowest, and a switch made
        # on them is paid for long after (the next look waits 1 / explore times what the wrong mode lost)
        self.first_samples = memory // 2 if first_samples is None else first_samples
        self.best = speculate_first            # the mode that measured faster (speculate first: it may pay)
        self.speculate = speculate_first       # this step's mode
        # a gate that starts in plain decoding does so on a smaller batch's measure (speculation lost
        # there, and a larger batch's forward is more compute-bound): it owes speculation no first look,
        # and looks at it as after a lost probe (not in a drain)
        self.first_look = speculate_first
        self.first_probe = False               # the probe running is the first look at the other mode
        self.stale = {True: False, False: False}   # fresh_probes: the mode's samples go with its look's first one
        self.probing = False                   # this step runs the other mode to measure it
        self.gap = gap                         # steps in the best mode before the next probe
        self.steps = 0                         # steps since the mode last changed
        # per mode, (the batch's new tokens, seconds) of each of its last `memory` steps: the rows' mean new
        # tokens times the batch's rows (rows accept different counts), over the rows' mean seconds
        self.samples = {True: deque(maxlen=memory), False: deque(maxlen=memory)}
        self.step_tokens_sum = {True: 0.0, False: 0.0}   # this step's row samples so far (they describe the last step)
        self.step_seconds_sum = {True: 0.0, False: 0.0}
        self.step_rows = {True: 0, False: 0}
        self.step_seconds = {True: 0.0, False: 0.0}  # ... and their seconds and new tokens, switch steps included
        self.step_tokens = {True: 0, False: 0}
        self.step_records = {True: 0, False: 0}
        self.recent = {True: deque(maxlen=probe_steps), False: deque(maxlen=probe_steps)}   # per mode, its
        #                                        last steps' (seconds, new tokens), switch steps left out
        self.probe_loss = 0.0                  # seconds the last probe lost against the best mode's rate
        self.best_seconds = 0.0                # seconds run in the best mode since the last probe
        self.rows_this_step: set[int] = set()
        self.draining = False                  # this step is in its call's drain (no prompt waiting)
        self._lock = threading.RLock()             # mode() decides (rate()) under it

    def measured(self) -> bool:
        """Whether both modes have been measured (the gate's choice rests on both rates)."""
        return self.rate(True) is not None and self.rate(False) is not None

    def rate(self, speculate: bool) -> float | None:
        """Recent batch tokens/s measured in that mode (None before a sample)."""
        with self._lock:
            samples = list(self.samples[speculate])
        if not samples:
            return None
        limit = STALL * statistics.median(seconds for _, seconds in samples)
        steady = [(tokens, seconds) for tokens, seconds in samples if seconds <= limit]
        return sum(tokens for tokens, _ in steady) / sum(seconds for _, seconds in steady)

    def beats(self, mode: bool, rate: float, other_rate: float) -> bool:
        """Whether `mode` at `rate` beats the other mode at `other_rate`: speculation by `margin` at least."""
        return rate > other_rate * (1 + self.margin) if mode else rate * (1 + self.margin) >= other_rate

    def mode(self, row: int, draining: bool = False) -> bool:
        """Whether row `row` (an id that stays the same over its steps) speculates this step. draining:
        the step is in its call's drain (no prompt waiting: DecodeState.batch_waiting == 0)."""
        with self._lock:
            if row in self.rows_this_step:     # every row proposes once a step: a repeat starts the next step
                self.rows_this_step.clear()
                self.end_step()
                self.draining = draining
                self._next_step()
            self.rows_this_step.add(row)
            return self.speculate

    def record(self, speculated: bool, new_tokens: int, seconds: float, rows: int, switch: bool = False,
               full: bool = True) -> None:
        """A row's last step: `new_tokens` over `seconds` of wall time in a batch of `rows` rows. switch:
        the step was its mode's first (it paid for the switch): counted in a probe's cost, not in the rate.
        full: the batch ran with all the rows it had (not in its drain's last, emptier steps): only such
        steps make the modes' rates, so that both are measured on the same rows."""
        if seconds <= 0:
            return
        with self._lock:
            if not switch and full:
                self.step_tokens_sum[speculated] += new_tokens * rows
                self.step_seconds_sum[speculated] += seconds
                self.step_rows[speculated] += 1
            self.step_seconds[speculated] += seconds
            self.step_tokens[speculated] += new_tokens
            self.step_records[speculated] += 1

    def end_step(self) -> None:
        """The rows' samples recorded since the last call make one step's (tokens, seconds) sample (mode()
        calls it), and the step's time goes to the best mode's run or to the cost of a probe."""
        with self._lock:
            for mode in (True, False):
                if self.step_rows[mode]:
                    if self.stale[mode]:
                        self.samples[mode].clear()
                        self.stale[mode] = False
                    self.samples[mode].append((self.step_tokens_sum[mode] / self.step_rows[mode],
                                               self.step_seconds_sum[mode] / self.step_rows[mode]))
                if self.step_records[mode]:
                    seconds = self.step_seconds[mode] / self.step_records[mode]    # the step's wall time
                    if self.step_rows[mode]:          # not a switch step (its catch-up is a probe's own cost)
                        self.recent[mode].append((seconds, self.step_tokens[mode]))
                    best_rate = self.rate(self.best)
                    if mode == self.best:
                        self.best_seconds += seconds
                    elif best_rate:          # a probe's step: what it took beyond the best mode's time
                        self.probe_loss += seconds - self.step_tokens[mode] / best_rate
                self.step_tokens_sum[mode], self.step_seconds_sum[mode], self.step_rows[mode] = 0.0, 0.0, 0
                self.step_seconds[mode], self.step_tokens[mode], self.step_records[mode] = 0.0, 0, 0

    def _next_step(self) -> None:
        self.steps += 1
        if self.probing:
            if self.steps < self.probe_steps:
                return
            # the probe's samples are in: probe_steps - 2 steps (the first pays for the switch and is not
            # counted, the last one's samples arrive during the next step)
            other, best = self.rate(not self.best), self.rate(self.best)
            if other is not None and (best is None or self.beats(not self.best, other, best)):
                # it won: what the old mode's last steps lost against it is what looking at that mode
                # again will cost (speculation's steps at a batch size where it loses); not its switch
                # step, which may have caught the drafter up on whole prompts
                self.probe_loss = max(0.0, sum(seconds - tokens / other for seconds, tokens in self.recent[self.best]))
                if self.fresh_probes and self.first_probe:
                    # ... but where the modes' own state changes how fast they run, the first mode's steps before
                    # the first look were its coldest (the table learning from nothing): what they lost says
                    # little of a later look, and charged in full it kept the table from being looked at again
                    # for four calls of the demo (benchmarks/results/auto_gate)
                    self.probe_loss = 0.0
                self.best, self.gap = not self.best, self.base_gap
            else:
                self.gap = min(2 * self.gap, self.max_gap)
            self.probing, self.speculate, self.steps, self.best_seconds = False, self.best, 0, 0.0
        elif self.first_look and self.rate(not self.best) is None:
            # the other mode never measured: look at it once this one has been measured enough
            if self.steps >= self.probe_steps and len(self.samples[self.best]) >= self.first_samples:
                self._start_probe(first=True)
        elif (self.steps >= self.gap and self.best_seconds * self.explore >= self.probe_loss
              and (self.best or not self.draining)):     # no look at speculation in a drain (the docstring)
            self._start_probe()

    def _start_probe(self, first: bool = False) -> None:
        self.probing, self.speculate, self.steps, self.probe_loss = True, not self.best, 0, 0.0
        self.first_probe = first
        if self.fresh_probes:        # its old samples go when the look's first counted one comes (end_step): until
            self.stale[self.speculate] = True     # then the mode keeps a rate (a call may end in the switch step)
