"""Counting host reads: every conversion of a tensor's value to a Python value (`.item()`,
`.tolist()`, `bool()`, `int()`, `float()`, `__index__`, `.numpy()`), which on a GPU is a device
synchronisation. On a CPU nothing synchronises, but the same conversions happen, so counting them
here holds the GPU's budget without a GPU.

    with HostReads() as reads:
        sd.generate(...)
    reads.by_area()      # {"engine": n, "strategy": n, "other": n}

A read is the strategy's (`strategy`) when a frame of strategies/ or heads/ is on the stack (a
drafter calling shared code such as specdec/sampling.py still counts as drafting), else the
engine's (`engine`: specdec/ — loop, verifier, acceptance, cache, ...) when a frame of specdec/
is. Its site is the innermost frame of our code. Reads with no frame of ours on the stack land in
`other`. Reads inside Hugging Face's model code called by us count for the area that called it;
`sites` tells them apart (the site is then our line that called the model).
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from contextlib import ContextDecorator

import torch

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_AREAS = {os.path.join(_REPO, "specdec") + os.sep: "engine",
          os.path.join(_REPO, "strategies") + os.sep: "strategy",
          os.path.join(_REPO, "heads") + os.sep: "strategy"}
_CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


def _area_of(filename: str) -> str | None:
    for prefix, area in _AREAS.items():
        if filename.startswith(prefix):
            return area
    return None


class HostReads(ContextDecorator):
    """Counts tensor -> host conversions while active (not thread-safe; tests only)."""

    def __init__(self):
        self.sites: Counter = Counter()      # (area, "file:line") -> reads
        self._saved: dict = {}

    def _record(self) -> None:
        frame = sys._getframe(2)
        where, area = "?", "other"
        while frame is not None:
            found = _area_of(frame.f_code.co_filename)
            if found is not None:
                if where == "?":
                    where = f"{os.path.relpath(frame.f_code.co_filename, _REPO)}:{frame.f_lineno}"
                if found == "strategy" or area == "other":
                    area = found
                if area == "strategy":
                    break
            frame = frame.f_back
        self.sites[(area, where)] += 1

    def __enter__(self) -> "HostReads":
        counter = self
        for name in _CONVERSIONS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapped(tensor, *args, _original=original, **kwargs):
                counter._record()
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, wrapped)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def total(self, area: str | None = None) -> int:
        return sum(n for (a, _), n in self.sites.items() if area is None or a == area)

    def by_area(self) -> dict[str, int]:
        out: Counter = Counter()
        for (area, _), n in self.sites.items():
            out[area] += n
        return dict(out)

    def report(self) -> str:
        """One line per read site, most frequent first (for assertion messages)."""
        return "\n".join(f"{n:6d}  {area:8s} {where}" for (area, where), n in self.sites.most_common())
