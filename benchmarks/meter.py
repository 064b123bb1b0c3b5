"""Counting and timing model forwards from the outside (forward hooks), the same way for specdec
rows and Hugging Face rows: how many target forwards a generation took, and how much of its wall
time was inside the target / draft forwards (the rest is drafting logic, acceptance, cache work,
Python)."""
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

    def watch(self, module: torch.nn.Module, role: str) -> None:
        """Count `module`'s forwards as `role` ("target" or "draft"); a module is watched once."""
        if id(module) in self._hooked:
            return
        self._hooked.add(id(module))
        started: list[float] = []

        def before(_module, _args):
            if self.current is not None:
                self.sync()
                started.append(time.perf_counter())

        def after(_module, _args, _output):
            if self.current is not None and started:
                self.sync()
                elapsed = time.perf_counter() - started.pop()
                if role == "target":
                    self.current.target_calls += 1
                    self.current.target_time_s += elapsed
                else:
                    self.current.draft_calls += 1
                    self.current.draft_time_s += elapsed

        self._handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    def tally(self) -> "_Open":
        return _Open(self)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class _Open:
    def __init__(self, meter: ForwardMeter):
        self.meter = meter

    def __enter__(self) -> ForwardTally:
        self.meter.current = ForwardTally()
        return self.meter.current

    def __exit__(self, *exc) -> None:
        self.meter.current = None
