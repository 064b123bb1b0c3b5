"""Int8 weights for a drafter's linear layers on a CPU (`eagle.dtype: int8`).

A drafter forward between two verifies runs on cold caches: its weights come back from memory at every
step, so on a CPU its cost follows the bytes it reads more than its arithmetic
(benchmarks/results/eagle_fused). Int8 weights, one scale per output row, halve those bytes against
bfloat16; the activations stay bfloat16 and torch's weight-only int8 kernel (`_weight_int8pack_mm`, the
one torchao's int8 weight-only layout calls on a CPU) computes x @ (w * scale).T. Only what is drafted
changes: the target verifies in its own dtype, so greedy output stays identical and sampled trees carry
the distributions they were drawn from.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from specdec.row_linear import packed_group, stacked_bias

INT8 = "int8"                         # the dtype name a drafter's config gives for int8 weights
ACTIVATIONS = torch.bfloat16          # the kernel's input and output dtype (float32 inputs run far slower)
# the kernel reads a row's inputs in vector-wide chunks with no tail: with another width it returns garbage or
# crashes (16 is enough on an AVX512 CPU; 32 leaves room for wider chunks). Narrower layers stay as they are.
K_MULTIPLE = 32


class Int8Linear(nn.Module):
    """y = x @ (weight * scale[:, None]).T (+ bias): weight int8 [out, in], scale [out] (the largest
    |w| of the row / 127, symmetric), x and y bfloat16. Buffers, not parameters: nothing to train."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None):
        """weight [out, in]: float, quantized here; or int8 already, with its `scale` [out]."""
        super().__init__()
        weight = weight.detach()
        if scale is None:
            weight = weight.float()
            scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0   # [out]
            weight = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        if weight.shape[1] % K_MULTIPLE:
            raise ValueError(f"Int8Linear needs in_features divisible by {K_MULTIPLE}, got {weight.shape[1]}")
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale.detach().to(ACTIVATIONS))
        self.register_buffer("bias", None if bias is None else bias.detach().to(ACTIVATIONS))
        self.out_features, self.in_features = weight.shape

    @classmethod
    def of(cls, layer: nn.Module) -> "Int8Linear":
        """The int8 copy of an nn.Linear (or of an Int8Linear: itself)."""
        return layer if isinstance(layer, Int8Linear) else cls(layer.weight, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:            # [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != ACTIVATIONS:
            flat = flat.to(ACTIVATIONS)
        out = torch._weight_int8pack_mm(flat, self.weight, self.scale)                      # [rows, out]
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


class Int8Group:
    """Int8 layers that read the same input (q, k, v; gate, up) as one product, with the interface of
    specdec.row_linear.PackedGroup: fused(x) -> their outputs side by side, group(x) -> each apart. The
    layers' own weights become views of the stacked ones: one copy of the bytes, whichever runs."""

    def __init__(self, layers: list[Int8Linear]):
        self.layers = layers
        self.sizes = [layer.out_features for layer in layers]
        self.stacked = Int8Linear(torch.cat([layer.weight for layer in layers]), stacked_bias(layers),   # [sum(out), in]
                                  scale=torch.cat([layer.scale for layer in layers]))
        stacked = self.stacked
        biases = [None] * len(layers) if stacked.bias is None else stacked.bias.split(self.sizes)
        for layer, weight, scale, bias in zip(layers, stacked.weight.split(self.sizes), stacked.scale.split(self.sizes),
                                              biases):
            layer.weight, layer.scale = weight, scale
            if layer.bias is not None:
                layer.bias = bias

    def prepare(self) -> "Int8Group":
        return self

    def fused(self, x: torch.Tensor) -> torch.Tensor:              # [..., in] -> [..., sum(out)]
        return self.stacked(x)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.fused(x).split(self.sizes, dim=-1)


def int8_supported(device: torch.device) -> bool:
    """Whether int8 drafter weights run here: a CPU whose torch has the weight-only int8 kernel (a
    trial product is run once per process). Where the CPU lacks bf16 dot products the kernel still
    runs; whether it pays is for the bench to say."""
    return device.type == "cpu" and _cpu_kernel_runs()


@functools.cache
def _cpu_kernel_runs() -> bool:
    """Whether a trial product of the CPU int8 kernel gives the right sums (once per process)."""
    try:
        probe = Int8Linear(torch.ones(8, K_MULTIPLE))
        return bool(torch.equal(probe(torch.ones(2, K_MULTIPLE)).float(), torch.full((2, 8), float(K_MULTIPLE))))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def quantizable(layer: nn.Module) -> bool:
    """Whether a linear layer can hold int8 weights: its input width is a multiple of K_MULTIPLE."""
    return isinstance(layer, nn.Linear) and layer.in_features % K_MULTIPLE == 0


def quantize_linears(module: nn.Module) -> int:
    """Swap every linear layer below `module` (nn.Linear and its subclasses, RowLinear's packed copies
    included) that can hold int8 weights (quantizable) for its Int8Linear copy, in place. Returns how
    many were swapped."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if quantizable(child):
                setattr(parent, name, Int8Linear.of(child))
                swapped += 1
    return swapped


def linear_group(layers: list[nn.Module]):
    """One product for layers that read the same input: an Int8Group where they hold int8 weights, else
    specdec.row_linear.packed_group's answer (packed, stacked, or None: each runs on its own)."""
    if all(isinstance(layer, Int8Linear) for layer in layers):
        return Int8Group(layers)
    return packed_group(layers)
