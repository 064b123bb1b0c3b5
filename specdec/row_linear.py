"""A twin of a model whose float32 CPU linear layers compute weight @ input.T: the kernel for forwards
of a few rows (a decode step, a small tree, a drafter level).

Why: PyTorch's CPU linear computes input @ weight.T. For one row that is a matrix-vector product,
which MKL runs on one thread; for 2 to about 8 rows it is a matrix product with a transposed right
operand, which packs the weight each call. Either way a forward reads the weights at a fraction of
the memory bandwidth the cores have, and at these row counts reading the weights is the forward's
cost. Written as weight @ input.T (the weight the left operand, as stored), the same product
streams the weight once on every thread. One row is padded to two, since a one-column product is
the matrix-vector product again.

The twin shares the model's parameters, buffers and config: its modules are shallow copies, and
each nn.Linear copy only changes class, to RowLinear, whose forward is the other
kernel. The model itself is never changed. The result is the same product summed in another order:
it differs from the model's in the last bits, as a forward of another row count does, and greedy
output is identical but for exact ties (tests/test_row_linear.py). Where it pays is the machine's
business, so it is an engine setting (`row_linear`: the most rows a forward may have to use the twin;
0 turns it off) and the cost profile that plans trees measures the forwards through it.

Hooks: the twin's top module shares the model's hook registries (a hook put on the model runs for the
twin's forwards too), but the modules below have registries of their own, copied when the twin is
made, because Hugging Face installs its output-recording hooks once per model object. A hook put on
an inner module of the target after the Speculator is built does not run in forwards through the
twin: set row_linear to 0 where one must.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .models import shallow_module


# weights below this many elements (512 KiB of float32) stay in a core's cache between forwards, so
# the one-thread matrix-vector product is not starved for memory and padding a row costs more than it saves
CACHED_WEIGHT = 1 << 17


class RowLinear(nn.Linear):
    """nn.Linear computing weight @ input.T (see the module's docstring). Made only by row_twin, as a
    class change of a shallow copy of an nn.Linear: it holds that layer's own parameters and hooks."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // input.shape[-1]
        if rows == 1 and self.weight.numel() < CACHED_WEIGHT:
            return super().forward(input)
        flat = input.reshape(rows, input.shape[-1])                          # [rows, in]
        if rows == 1:
            flat = torch.cat([flat, flat])                                   # [2, in]: not a matrix-vector product
        out = torch.mm(self.weight, flat.t())[:, :rows].t()                  # [rows, out], transposed in memory
        if self.bias is not None:
            out = out + self.bias
        return out.contiguous().reshape(*input.shape[:-1], self.out_features)


def qualifies(module: nn.Module) -> bool:
    """A plain nn.Linear (no subclass: a quantized or adapted layer keeps its own forward) with a
    float32 weight on the CPU."""
    return type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"


def row_twin(model: nn.Module) -> nn.Module | None:
    """The model's twin with RowLinear layers, or None when it has no layer that qualifies. The top
    module is a plain copy, so hooks put on the model later (a forward meter's) see the twin's
    forwards too; every module below has registries of its own (specdec.models.shallow_module), so
    what Hugging Face hooks into the layers it calls for recorded outputs is installed once in each."""
    def twin(module: nn.Module, top: bool = False) -> nn.Module:
        if qualifies(module):
            layer = shallow_module(module)
            layer.__class__ = RowLinear
            return layer
        shell = copy.copy(module) if top else shallow_module(module)
        shell._modules = {name: None if child is None else twin(child) for name, child in module._modules.items()}
        return shell

    result = twin(model, top=True)
    return result if any(isinstance(module, RowLinear) for module in result.modules()) else None
