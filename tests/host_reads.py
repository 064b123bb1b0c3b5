"""Counting host syncs on a CPU the way a GPU would see them: device -> host reads and host -> device
writes, by area (engine / strategy).

    with HostReads() as syncs:
        sd.generate(...)
    syncs.by_area()               # reads:  {"engine": n, "strategy": n, "other": n}
    syncs.by_area("write")        # writes: the same areas
    syncs.report()                # one line per site, reads and writes

On a GPU three things make the host wait for the device or copy to it, and all three happen on a CPU
too, so counting them here holds the GPU's budget without a GPU:

* reads (kind "read"): a device tensor's value converted to a Python value (`.item()`, `.tolist()`,
  `bool()`, `int()`, `float()`, `__index__`, `.numpy()`, `.cpu()`, `.to("cpu")`, `torch.equal`,
  `allclose`), and ops whose output size depends on the data, which read it back to size their
  output: `nonzero`, `argwhere`, one-argument `where`, `masked_select`, `unique`, boolean-mask
  indexing (`x[mask]`, `x[mask] = v`), `repeat_interleave` with tensor repeats and no `output_size`,
  `bincount` without `minlength`.
* writes (kind "write"): host data reaching the device: `torch.tensor(data, device=...)` (and
  `as_tensor` / `asarray` / `new_tensor` of Python data), indexing a device tensor with a Python list
  (torch makes a host index tensor and copies it over), and a *host tensor* meeting the device: moved
  by `.to(device)` / `.cuda()`, or given to an op together with device tensors (an index, a `cat`
  part, an assigned value). A 0-d host tensor among device tensors is a scalar argument on CUDA,
  not a copy, and is not counted.

Which tensors are host tensors: the CPU cannot tell a CPU tensor meant as host memory from one
meant as device memory, so the counter follows what the code says. A tensor made without a
`device=` (`torch.tensor(list)`, `torch.zeros(n)`, `torch.eye(n)`, ...) is on the host, as it would
be on a GPU machine; one made with `device=` (the model's device in our code), a module's weights
and everything computed from a device tensor are on the device; ops over host tensors alone stay
on the host (and reading their values back is free). Tensors this counter never saw made (created
before it started: module weights, caches kept across calls) count as device tensors, except that
moving one with `.to(device)` counts as a write (a CPU-side cache moved every step is a copy on a
GPU). Writes made without a device sync on CUDA (pinned memory, non_blocking) count all the same:
the budget is on the copies, not on how they are made.

Areas: a sync is the strategy's (`strategy`) when a frame of strategies/ or heads/ is on the stack
(a drafter calling shared code such as specdec/sampling.py still counts as drafting), else the
engine's (`engine`: specdec/ - loop, verifier, acceptance, cache, ...) when a frame of specdec/ is.
Its site is the innermost frame of our code, with the innermost frame outside torch in brackets
when that is another library's (Hugging Face's model code called by us). Syncs with no frame of
ours on the stack land in `other`.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from contextlib import ContextDecorator

import torch
from torch.overrides import TorchFunctionMode



def _package_dir(module: str) -> str:
    return os.path.dirname(os.path.abspath(__import__(module, fromlist=["_"]).__file__)) + os.sep


# where the imported specdec lives (this checkout, or an installed copy: scripts/measure/host_reads_table.py
# counts another version with this counter); the longest prefix wins (installed, strategies/ is inside specdec/)
_AREAS = dict(sorted({_package_dir("specdec"): "engine", _package_dir("specdec.strategies"): "strategy",
                      _package_dir("specdec.heads"): "strategy"}.items(), key=lambda item: -len(item[0])))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HERE = os.path.abspath(__file__)

_CONVERSIONS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy",
                "__array__", "equal", "allclose", "is_nonzero"}
_DATA_FACTORIES = {"tensor", "as_tensor", "asarray", "new_tensor"}
_SIZED_BY_DATA = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "_unique", "_unique2"}
_MOVES = {"to", "cuda", "cpu", "as_tensor", "asarray"}
_TAG = "_specdec_on_host"        # attribute set on the tensors the counter saw made: True host, False device


def _area_of(filename: str) -> str | None:
    for prefix, area in _AREAS.items():
        if filename.startswith(prefix):
            return area
    return None


def _short(filename: str) -> str:
    """specdec/verifier.py, strategies/eagle.py: the path from the folder above the area's."""
    for prefix in _AREAS:
        if filename.startswith(prefix):
            return os.path.relpath(filename, os.path.dirname(prefix.rstrip(os.sep)))
    return filename


def _tensors(args, kwargs):
    """The tensors among an op's arguments, one level into lists and tuples (cat's parts, index tuples)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


def _on_host(tensor) -> bool:
    return getattr(tensor, _TAG, False) is True


def _known(tensor) -> bool:
    return hasattr(tensor, _TAG)


def _is_python_data(value) -> bool:
    """A list / tuple (of numbers or lists) or a number: data that lives on the host."""
    return isinstance(value, (list, tuple, int, float, bool)) and not isinstance(value, torch.Size)


def _has_python_list(index) -> bool:
    """An index that contains a Python list (torch turns it into an index tensor on the host)."""
    if isinstance(index, list):
        return True
    return isinstance(index, tuple) and any(isinstance(part, list) for part in index)


def _bool_index(index) -> torch.Tensor | None:
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, torch.Tensor) and part.dtype == torch.bool:
            return part
    return None


def _target_device(args, kwargs):
    """The device a `.to(...)` call moves to (None: a dtype change only): 'cpu' for the string, else
    'device' (any torch.device / other string / a tensor: the model's device in our code)."""
    candidates = list(args[1:]) + [kwargs.get("device"), kwargs.get("other")]
    for value in candidates:
        if isinstance(value, str):
            return "cpu" if value == "cpu" else "device"
        if isinstance(value, (torch.device, torch.Tensor)):
            return "device"
    return None


class _Mode(TorchFunctionMode):
    def __init__(self, counter: "HostReads"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out_on_host = self._classify(name, args, kwargs)
        out = func(*args, **kwargs)
        if out_on_host is not None:
            if name in _MOVES and args and out is args[0] and _on_host(out) != out_on_host:
                out = out.view(out.shape)   # on a CPU a move returns its input: tag a twin, not the source
            _tag(out, out_on_host)
        return out

    def _classify(self, name: str, args, kwargs):
        """Count what the op does; return whether its output is on the host (None: leave it untagged)."""
        record = self.counter._record
        tensors = list(_tensors(args, kwargs))
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in _CONVERSIONS:
            if any(not _on_host(t) for t in tensors):
                record("read")
            return None
        if name in _DATA_FACTORIES and (not tensors or name == "new_tensor"):
            data = args[1] if name == "new_tensor" else (args[0] if args else kwargs.get("data"))
            if isinstance(data, (list, tuple)) and any(not _on_host(t) for t in _tensors(data, {})):
                record("read")                      # torch.tensor([device scalars]) reads each one back
            if name == "new_tensor":
                on_host = _on_host(first)
            else:
                on_host = kwargs.get("device") is None
            if not on_host and _is_python_data(data) and torch.as_tensor(data).numel():
                record("write")
            return on_host
        if name in _MOVES and first is not None:
            target = "cpu" if name == "cpu" else ("device" if name == "cuda" else _target_device(args, kwargs))
            if target is None:
                return _on_host(first) if _known(first) else None
            if target == "cpu":
                if not _on_host(first):
                    record("read")
                return True
            if _on_host(first) or not _known(first):
                if first.numel():
                    record("write")
            return False
        if not tensors:                             # a factory of no data: where `device=` puts it
            return kwargs.get("device") is None
        host = [t for t in tensors if _on_host(t)]
        device = [t for t in tensors if not _on_host(t)]
        if not device:
            return True                             # host work only: no sync
        if any(t.dim() > 0 for t in host):          # a host tensor given to a device op: a copy
            record("write")
        if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and first is not None \
                and not _on_host(first):
            index = args[1] if len(args) > 1 else None
            if _has_python_list(index):
                record("write")
            mask = _bool_index(index)
            if mask is not None or (name.startswith("index_put") and any(
                    isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (index or ()))):
                record("read")                      # a boolean mask is turned into indices: sized by data
            if name == "__setitem__" and len(args) > 2 and isinstance(args[2], (list, tuple)):
                record("write")
        elif name in _SIZED_BY_DATA or (name == "where" and len(args) + len(kwargs) == 1):
            record("read")
        elif name == "repeat_interleave" and kwargs.get("output_size") is None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats", first if len(args) == 1 else None)
            if isinstance(repeats, torch.Tensor) and not _on_host(repeats):
                record("read")
        elif name == "bincount" and not kwargs.get("minlength") and len(args) < 3:
            record("read")
        return False


def _tag(out, on_host: bool) -> None:
    if isinstance(out, torch.Tensor):
        try:
            setattr(out, _TAG, on_host)
        except (AttributeError, RuntimeError):      # a tensor type that takes no attributes
            pass
    elif isinstance(out, (list, tuple)):
        for item in out:
            _tag(item, on_host)


class HostReads(ContextDecorator):
    """Counts host reads and writes while active, in this thread (tests only)."""

    def __init__(self):
        self.sites: Counter = Counter()      # (kind, area, "file:line") -> count; kind "read" / "write"
        self._mode = None

    def _record(self, kind: str) -> None:
        frame = sys._getframe(1)
        where, via, area = "?", None, "other"
        while frame is not None:
            filename = frame.f_code.co_filename
            found = _area_of(filename)
            if found is not None:
                if where == "?":
                    where = f"{_short(filename)}:{frame.f_lineno}"
                if found == "strategy" or area == "other":
                    area = found
                if area == "strategy":
                    break
            elif where == "?" and via is None and not filename.startswith(_TORCH) and filename != _HERE \
                    and "/torch/" not in filename:
                via = f"{os.path.basename(os.path.dirname(filename))}/{os.path.basename(filename)}:{frame.f_lineno}"
            frame = frame.f_back
        if via is not None and where != "?":
            where = f"{where} ({via})"
        self.sites[(kind, area, where)] += 1

    def __enter__(self) -> "HostReads":
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None

    def total(self, area: str | None = None, kind: str = "read") -> int:
        return sum(n for (k, a, _), n in self.sites.items() if k == kind and (area is None or a == area))

    def writes(self, area: str | None = None) -> int:
        return self.total(area, "write")

    def by_area(self, kind: str = "read") -> dict[str, int]:
        out: Counter = Counter()
        for (k, area, _), n in self.sites.items():
            if k == kind:
                out[area] += n
        return dict(out)

    def report(self, kind: str | None = None) -> str:
        """One line per site, most frequent first (for assertion messages)."""
        return "\n".join(f"{n:6d}  {k:5s} {area:8s} {where}" for (k, area, where), n in self.sites.most_common()
                         if kind is None or k == kind)


HostSyncs = HostReads
