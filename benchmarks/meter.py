"""Counting and timing model forwards from the outside (forward hooks), the same way for specdec
rows and Hugging Face rows: how many target forwards a generation took, and how much of its wall
time was inside the target / draft forwards (the rest is drafting logic, acceptance, cache work,
Python).

Only the outermost watched forward counts: a watched module may run inside another (the target's
lm_head, which early_exit's head also runs alone; a view of the target that carries the target's
hooks), and its time is then part of the outer forward's, counted once, under the outer one's role."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class ForwardTally:
    target_calls: int = 0
    target_time_s: float = 0.0
    draft_calls: int = 0              # draft models and heads (anything but the target)
    draft_time_s: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class ForwardMeter:
    """Hooks on the top-level modules; counts only while a tally is open (`with meter.tally() as t`)."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.current: ForwardTally | None = None
        self._hooked: set[int] = set()
        self._handles = []
        self._depth = 0                   # watched forwards running now, one inside another
        self._outer: tuple[str, float] | None = None    # (role, start) of the outermost of them

    def watch(self, module: torch.nn.Module, role: str) -> None:
        """Count `module`'s forwards as `role` ("target" or "draft"); a module is watched once."""
        if id(module) in self._hooked:
            return
        self._hooked.add(id(module))

        def before(_module, _args):
            if self.current is None:
                return
            if self._depth == 0:
                self.sync()
                self._outer = (role, time.perf_counter())
            self._depth += 1

        def after(_module, _args, _output):
            if self.current is None or self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self.sync()
                outer_role, started = self._outer
                elapsed = time.perf_counter() - started
                if outer_role == "target":
                    self.current.target_calls += 1
                    self.current.target_time_s += elapsed
                else:
                    self.current.draft_calls += 1
                    self.current.draft_time_s += elapsed

        # always_call: a forward that raises still closes its level
        self._handles += [module.register_forward_pre_hook(before),
                          module.register_forward_hook(after, always_call=True)]

    def tally(self) -> "_Open":
        return _Open(self)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def watch_rows(meter: ForwardMeter, target: torch.nn.Module, rows) -> None:
    """Watch the target and what each benchmark row runs besides it: the modules through which its verify
    runs the target's own layers (row.target_parts(): target forwards) and its drafting modules
    (row.modules(): draft forwards)."""
    meter.watch(target, "target")
    for row in rows:
        for module in row.target_parts():
            meter.watch(module, "target")
        for module in row.modules():
            meter.watch(module, "draft")


class _Open:
    def __init__(self, meter: ForwardMeter):
        self.meter = meter

    def __enter__(self) -> ForwardTally:
        self.meter._depth = 0
        self.meter.current = ForwardTally()
        return self.meter.current

    def __exit__(self, *exc) -> None:
        self.meter.current = None
        self.meter._depth = 0
