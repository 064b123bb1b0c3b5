"""The server's engine: one thread owns the batch. Requests' rows (one per choice) wait in a bounded
queue; between two steps the batch takes waiting rows into free slots (specdec.batch.decode_batch fed
from the live queue: continuous batching), and each step hands every row's new tokens to that row's
`deliver` callback (the request handler's own queue). A cancelled row (its client went away) leaves
the batch after the step it is in; a waiting one never starts.

No web framework here: the engine is plain threads and the library's batch, so it is tested and used
without FastAPI (specdec.serve.app puts HTTP in front of it)."""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..batch import Job, decode_batch
from ..loop import _Clock
from ..types import Stats

log = logging.getLogger(__name__)

# deliver(new tokens, finish reason or None, error message or None), called on the engine thread
Deliver = Callable[[list[int], "str | None", "str | None"], None]


class QueueFull(Exception):
    """Admission refused: the waiting rows would pass max_queue."""


class EngineStopped(Exception):
    """The engine no longer takes rows (the server is shutting down, or its thread died)."""


@dataclass
class Row:
    """One choice of one request, as the engine sees it."""
    job: Job
    deliver: Deliver
    started: bool = False
    done: bool = False
    forwards_seen: int = 0           # verify steps already counted in the metrics
    proposed_seen: int = 0


class SpecCounters:
    """Where the engine counts speculation (vLLM's spec-decode counters): specdec.serve.metrics
    puts Prometheus counters behind this; the default counts nothing."""

    def step(self, drafted: int, accepted: int) -> None:
        """One verify step of one row: `drafted` tree nodes proposed, `accepted` of them kept."""

    def finished(self, stats: Stats, reason: str) -> None:
        """A row left the batch (reason: eos, stop, length, cancelled, error)."""


class Engine:
    """Continuous batching over one Speculator: submit() rows from any thread, cancel() them, stop().
    At most `max_batch` rows run at once; at most `max_queue` rows wait beyond the batch's free slots
    (submit raises QueueFull past it). Every step runs under the Speculator's step lock, so library
    calls on the same Speculator (generate, stream) still interleave safely with the server's batch."""

    def __init__(self, speculator, max_batch: int = 16, max_queue: int = 256, counters: SpecCounters | None = None):
        if max_batch < 1 or max_queue < 0:
            raise ValueError(f"max_batch must be >= 1 and max_queue >= 0, got {max_batch} and {max_queue}")
        self.speculator, self.max_batch, self.max_queue = speculator, max_batch, max_queue
        self.counters = counters or SpecCounters()
        self.waiting: deque[Job] = deque()          # the live queue decode_batch takes rows from
        self.rows: dict[int, Row] = {}              # job index -> its row, until it leaves
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._stopping = False
        self.error: BaseException | None = None     # what killed the thread, if anything did
        self.steps = 0                              # batched forwards so far
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)

    # ------------------------------------------------------------------ the handlers' side
    def start(self) -> "Engine":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def running(self) -> int:
        """Rows in the batch now."""
        return sum(1 for row in list(self.rows.values()) if row.started and not row.done)

    @property
    def queued(self) -> int:
        """Rows waiting for a slot (cancelled ones included until the batch skips them)."""
        return len(self.waiting)

    def new_index(self) -> int:
        return next(self._ids)

    def submit(self, jobs: list[Job], delivers: list[Deliver]) -> None:
        """Queue a request's rows (all or none). Raises QueueFull or EngineStopped."""
        with self._wake:
            if not self.alive:
                raise EngineStopped("the server is shutting down" if self._stopping else
                                    f"the engine stopped: {self.error!r}")
            free = max(0, self.max_batch - self.running)        # rows that start at the next step
            if len(self.waiting) + len(jobs) > self.max_queue + free:
                raise QueueFull(f"{len(self.waiting)} rows are waiting and this request adds {len(jobs)}, with "
                                f"{free} free slots in the batch and room for {self.max_queue} more to wait "
                                f"(--max-queue): retry later")
            for job, deliver in zip(jobs, delivers):
                job.start = self._starting(job.index, job.start)
                self.rows[job.index] = Row(job, deliver)
                self.waiting.append(job)
            self._wake.notify()

    def cancel(self, indices) -> None:
        """The rows `indices` are no longer wanted: a running one leaves the batch after its step, a
        waiting one is skipped."""
        for index in indices:
            row = self.rows.get(index)
            if row is not None:
                row.job.cancelled = True

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking rows, end the batch after the step it is in, tell every row left that the server
        is shutting down, and join the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._fail(list(self.rows), "the server is shutting down")

    # ------------------------------------------------------------------ the engine thread
    def _starting(self, index: int, start):
        def started(prompt_hidden, stats, **prefilled):       # prefilled: what else the prefill gave (top-k ids)
            row = self.rows.get(index)
            if row is not None:
                row.started = True
            return start(prompt_hidden, stats, **prefilled)
        return started

    def _run(self) -> None:
        sd = self.speculator
        clock = _Clock(sd.verifier.device, sd.profile)
        try:
            while True:
                with self._wake:
                    while not self.waiting and not self._stopping:
                        self._wake.wait()
                    if self._stopping:
                        return
                steps = decode_batch(sd.verifier, sd.strategy, self.waiting, self.max_batch, clock)
                try:
                    while not self._stopping:
                        with sd._serial():
                            step = next(steps, None)
                        if step is None:
                            break
                        self.steps += 1
                        self._deliver(step)
                except Exception as exc:  # noqa: BLE001 - one bad batch must not take the server down
                    log.exception("a batch step failed; its rows get an error, the server goes on")
                    queued = {job.index for job in list(self.waiting)}
                    self._fail([i for i in list(self.rows) if i not in queued], f"generation failed: {exc}")
                finally:
                    with sd._serial():
                        steps.close()
        except BaseException as exc:  # noqa: BLE001 - recorded: /health reports it
            self.error = exc
            log.exception("the engine thread died")
            self._fail(list(self.rows), f"the engine stopped: {exc}")

    def _deliver(self, step) -> None:
        for index, run, reason in step:
            row = self.rows.get(index)
            if row is None:
                continue
            stats = row.job.stats
            if stats.target_forwards > row.forwards_seen:         # one verify step of this row
                self.counters.step(stats.proposed_nodes - row.proposed_seen, stats.accepted_lengths[-1])
            row.forwards_seen, row.proposed_seen = stats.target_forwards, stats.proposed_nodes
            if reason is not None:
                row.done = True
                self.rows.pop(index, None)
                self.counters.finished(stats, reason)
            if reason != "cancelled":
                self._call(row, run, reason, None)

    def _fail(self, indices, message: str) -> None:
        for index in indices:
            row = self.rows.pop(index, None)
            if row is not None:
                row.done = True
                row.job.cancelled = True
                self.counters.finished(row.job.stats, "error")
                self._call(row, [], None, message)

    @staticmethod
    def _call(row: Row, run, reason, error) -> None:
        try:
            row.deliver(run, reason, error)
        except Exception:  # noqa: BLE001 - a handler gone (its event loop closed) must not stop the batch
            log.debug("a row's handler could not be told", exc_info=True)
