"""A twin of a model whose float32 CPU linear layers compute weight @ input.T: the kernel for forwards
of a few rows (a decode step, a small tree, a drafter level).

Why: PyTorch's CPU linear computes input @ weight.T. For one row that is a matrix-vector product,
which MKL runs on one thread; for 2 to about 8 rows it is a matrix product with a transposed right
operand, which packs the weight each call. Either way a forward reads the weights at a fraction of
the memory bandwidth the cores have, and at these row counts reading the weights is the forward's
cost. Written as weight @ input.T (the weight the left operand, as stored), the same product
streams the weight once on every thread. One row is padded to two, since a one-column product is
the matrix-vector product again.

Only layers whose weights are too large to stay in a core's cache are twinned (CACHED_WEIGHT): a
small weight is never starved for memory, and PyTorch's own product is then the faster one.

The twin shares the model's parameters, buffers and config: its modules are shallow copies, and
each large nn.Linear copy only changes class, to RowLinear, whose forward is the other
kernel. The model itself is never changed. The result is the same product summed in another order:
it differs from the model's in the last bits, as a forward of another row count does, and greedy
output is identical but for exact ties (tests/test_row_linear.py). Where it pays is the machine's
business, so it is an engine setting (`row_linear`: the most rows a forward may have to use the twin;
0 turns it off) and the cost profile that plans trees measures the forwards through it.

Where PyTorch has oneDNN (every x86 and Arm CPU build), a weight large enough to matter is also kept
packed in oneDNN's blocked layout, and forwards of more than PACKED_ROWS rows run oneDNN's linear on
it: a tree's 3 to 16 rows then cost little more than one row does, where both products above slow
down with every row, and a prompt's rows cost less than PyTorch's own product. So with packed
weights every forward of the target takes the twin. The packed copy is memory beside the weight (as
much again as the layers packed), so it is made only while it fits well inside the memory the
machine has free (PACK_SHARE); it is shared by every twin of the same weight and made again if the
weight changes (stamp). bfloat16 layers are twinned where oneDNN runs bfloat16 natively, and then
always take the packed kernel: PyTorch's own bfloat16 product is the slower one at every row count.
EAGLE drafters, specdec's own modules, get packed layers in place (pack_layers) and run their q/k/v
and gate/up projections as one product each (PackedGroup).

Hooks: the twin's top module shares the model's hook registries (a hook put on the model runs for the
twin's forwards too), but the modules below have registries of their own, copied when the twin is
made, because Hugging Face installs its output-recording hooks once per model object. A hook put on
an inner module of the target after the Speculator is built does not run in forwards through the
twin: set row_linear to 0 where one must.
"""
from __future__ import annotations

import copy
import functools
import os
import weakref

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .models import shallow_module


# weights below this many elements (512 KiB of float32) stay in a core's cache between forwards: their
# products are not starved for memory, so neither streaming them (weight @ input.T) nor packing them pays.
# Such a layer is not twinned: PyTorch's own product is up to twice as fast on one thread at 2-9 rows
# (128 x 128 to 344 x 128 weights), and the twin's Python costs a little on every call
# (benchmarks/results/packed_linear: small weights)
CACHED_WEIGHT = 1 << 17


# past this many rows the weight @ input.T product is slower than PyTorch's own (the kernel table in
# benchmarks/results/row_linear): an unpacked layer then runs nn.Linear's
TRANSPOSED_ROWS = 8


def _packed_rows() -> int:
    """A float32 forward of at most this many rows takes the weight @ input.T product above even where a
    packed weight exists: at a few rows oneDNN's fixed cost per call (about 15 us) outweighs what its
    kernel saves. With AVX-512 its kernel wins from 3 rows on, with AVX2 only from 5
    (benchmarks/results/packed_linear: the kernels, with oneDNN, MKL and ATen held to AVX2)."""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = "DEFAULT"
    return 2 if capability.startswith("AVX512") else 4


PACKED_ROWS = _packed_rows()

# the row count oneDNN lays a packed weight out for: a tree's forwards run 3 to about 16 rows, where this
# layout is 4-9% faster than the default one (benchmarks/results/packed_linear: the kernels), and a
# prompt's hundreds of rows lose nothing by it
ROWS_HINT = 16

# the packed copies a twin makes may take at most this share of the memory free when it is made
PACK_SHARE = 0.25

# the `packed_linear` setting, process-wide as PyTorch's own backend switches are: whether twins made
# from now on pack their weights (each Speculator sets it from its config as it is built)
PACK = True

# weight -> (its stamp when packed, a weak reference to the packed copy): one copy per weight for every
# twin and drafter alive (they hold it; specdec.row_linear.packed_weight)
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def set_packing(on: bool) -> None:
    """The `packed_linear` setting: twins made from now on pack their large weights (on) or not."""
    global PACK
    PACK = bool(on)


def packs(model: nn.Module, row_linear: int) -> bool:
    """Whether a verifier of `model` made now with this row_linear setting runs packed weights (the
    setting on, a layer worth packing, the copies fitting in memory): cost profiles are keyed by it."""
    return bool(row_linear) and PACK and pack_fits(large_layers(model, True))


def can_pack(dtype: torch.dtype) -> bool:
    """oneDNN runs linear layers of this dtype on this CPU: float32 wherever PyTorch has oneDNN,
    bfloat16 only where the CPU has native bfloat16 instructions (else oneDNN emulates it, slowly)."""
    return dtype in _packable_dtypes()


@functools.cache
def _packable_dtypes() -> frozenset:
    """The dtypes can_pack accepts, asked of this PyTorch once: none where it lacks oneDNN or the ops
    (torch >= 2.1 is allowed; the packed linear ops came with oneDNN's inductor support)."""
    try:
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
            return frozenset()
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return frozenset()
    return frozenset({torch.float32, torch.bfloat16} if bf16 else {torch.float32})


def stamp(weight: torch.Tensor) -> tuple[int, int]:
    """What the packed copy of a weight was made from: its storage (which `.to()` and `.data =` swap
    under the same Parameter) and its version counter (which every in-place change of the weight
    moves). Not seen: an in-place change through `weight.data` (a tensor with a version counter of
    its own) or of a tensor made in inference mode (it has none: -1 here). After such a change, build
    the Speculator again (docs/configuration.md, `packed_linear`)."""
    return weight.data_ptr(), -1 if weight.is_inference() else weight._version


def packed_weight(weight: torch.Tensor) -> tuple[tuple[int, int], torch.Tensor] | None:
    """(the weight's stamp, the weight in oneDNN's blocked layout), made once per stamp and shared by
    every layer that holds it; None where the weight cannot run packed now (moved off the CPU, cast to
    a dtype oneDNN does not run here). The layers that use a copy hold it: this cache holds it weakly,
    so a copy lives as long as some twin or drafter uses it, not as long as the user's model."""
    if weight.device.type != "cpu" or not can_pack(weight.dtype):
        return None
    now = stamp(weight)
    held = _PACKED.get(weight)
    packed = held[1]() if held is not None and held[0] == now else None
    if packed is None:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        _PACKED[weight] = (now, weakref.ref(packed))
    return now, packed


def training(weights, input: torch.Tensor | None = None) -> bool:
    """Gradients are being taken through this product (of a weight, or of the input reaching a frozen
    layer): none flows through a packed copy, so the layer takes the products of the weight itself."""
    return torch.is_grad_enabled() and (any(w.requires_grad for w in weights)
                                        or (input is not None and input.requires_grad))


class PackedGroup:
    """Linear layers that read the same input (a block's q, k and v projections; its gate and up
    projections) run as ONE product of their weights stacked, its output split back (or kept whole:
    `fused`): one call's fixed cost instead of one per layer. `packed`: the stacked copy is in
    oneDNN's blocked layout (layers pack_layers packed); else it is a plain stacked weight, for small
    layers that PyTorch's own product runs best (a drafter of a small target pays per call, not per
    byte read). The layers keep their own parameters (what is saved and trained); the stacked copy
    follows them as a layer's packed copy does, and while one of them takes gradients each runs on
    its own."""

    def __init__(self, layers: list[nn.Linear], packed: bool = True):
        self.layers = list(layers)
        self.sizes = [layer.out_features for layer in self.layers]
        self.packed = packed
        self._held: tuple | None = None           # (the layers' stamps, stacked weight (packed or not), stacked bias)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_held": None}      # as RowLinear's: the packed copy is not copied

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.fused(x)
        if out is None:
            return tuple(layer(x) for layer in self.layers)
        return out.split(self.sizes, dim=-1)

    def fused(self, x: torch.Tensor) -> torch.Tensor | None:
        """x [..., in] -> [..., sum of the layers' out features], their outputs side by side from one
        product; None where they must run each on its own (gradients taken, moved off the CPU, mixed
        dtypes)."""
        weights = [layer.weight for layer in self.layers]
        held = None if training(weights, x) else self.prepare()
        if held is None:
            return None
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, held[1], held[2], "none", [], "")
        return nn.functional.linear(x, held[1], held[2])

    def prepare(self) -> tuple | None:
        """The stacked copy (and bias) of the layers' weights as they are now, made if needed; None
        where they cannot run as one now (moved off the CPU or apart, another dtype): each runs on its
        own."""
        weights = [layer.weight for layer in self.layers]
        stamps = tuple(stamp(w) for w in weights)
        if self._held is not None and self._held[0] == stamps:
            return self._held
        # a move off the CPU or a cast swaps a weight's storage, so it is looked for only when the stamps move
        if (any(w.device.type != "cpu" or w.dtype != weights[0].dtype for w in weights)
                or (self.packed and not can_pack(weights[0].dtype))):
            self._held = None
            return None
        with torch.no_grad():
            stacked = torch.cat([w.detach() for w in weights])                         # [sum(out), in]
            bias = stacked_bias(self.layers)
            if self.packed:
                stacked = torch.ops.mkldnn._reorder_linear_weight(stacked, ROWS_HINT)
            self._held = (stamps, stacked, bias)
        return self._held


def stacked_bias(layers: list[nn.Module]) -> torch.Tensor | None:
    """[sum of out features] the layers' biases side by side (zeros for a layer without one), or None
    where none has one: the bias of their stacked product."""
    biases = [layer.bias for layer in layers]
    if all(b is None for b in biases):
        return None
    like = next(b for b in biases if b is not None)
    return torch.cat([b.detach() if b is not None else like.new_zeros(layer.out_features)
                      for b, layer in zip(biases, layers)])


def packed_group(layers: list[nn.Linear]) -> PackedGroup | None:
    """A PackedGroup of these layers: packed where their own packed kernel is in effect (pack_layers
    packed them all: same dtype, the setting on, the copy fits); a plain stacked one where none of
    them is twinned (small layers, which keep PyTorch's own product); else None: each runs on its own
    (twinned but unpacked layers keep their weight @ input.T kernel)."""
    if all(isinstance(layer, RowLinear) and layer.packed for layer in layers):
        return PackedGroup(layers)
    if not any(isinstance(layer, RowLinear) for layer in layers):
        return PackedGroup(layers, packed=False)
    return None


class RowLinear(nn.Linear):
    """nn.Linear computing weight @ input.T, or oneDNN's linear on a packed copy of the weight (see
    the module's docstring). Made only by row_twin, as a class change of a shallow copy of an
    nn.Linear: it holds that layer's own parameters and hooks, and `packed` says whether it may use
    the packed kernel."""

    packed = False

    def __getstate__(self) -> dict:
        """Copies (copy.deepcopy, pickle) leave the packed copy behind: oneDNN's layout cannot be copied,
        and the copy's weight is another tensor, packed when first used."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {key: value for key, value in state.items() if key != "_held"}

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // input.shape[-1]
        if (self.packed and (rows > PACKED_ROWS or self.weight.dtype != torch.float32)
                and not training((self.weight,), input)):
            held = self.__dict__.get("_held")         # this layer's hold on the shared copy: no lookup
            if held is None or held[0] != stamp(self.weight):
                held = self._held = packed_weight(self.weight)    # None: moved off the CPU or to another dtype
            if held is not None:
                return torch.ops.mkldnn._linear_pointwise(input, held[1], self.bias, "none", [], "")
            if self.weight.device.type != "cpu" or self.weight.dtype != torch.float32:
                return super().forward(input)             # the products below are for float32 on a CPU
        if rows > TRANSPOSED_ROWS:
            return super().forward(input)
        flat = input.reshape(rows, input.shape[-1])                          # [rows, in]
        if rows == 1:
            flat = torch.cat([flat, flat])                                   # [2, in]: not a matrix-vector product
        out = torch.mm(self.weight, flat.t())[:, :rows].t()                  # [rows, out], transposed in memory
        if self.bias is not None:
            out = out + self.bias
        return out.contiguous().reshape(*input.shape[:-1], self.out_features)


def runs_packed(twin: nn.Module | None) -> bool:
    """Whether a twin's large layers run packed weights: then forwards of any row count gain by it."""
    return twin is not None and any(isinstance(m, RowLinear) and m.packed for m in twin.modules())


def free_memory() -> int | None:
    """Bytes of memory this process may still allocate: the machine's free memory (Linux:
    MemAvailable), or less where a cgroup (a container) caps the process lower; None where neither
    can be read."""
    free = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    try:                                    # cgroup v2: the limit less what the group uses
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            cap = limit.read().strip()
            if cap != "max":
                room = max(0, int(cap) - int(used.read().strip()))
                free = room if free is None else min(free, room)
    except (OSError, ValueError):
        pass
    return free


def qualifies(module: nn.Module, pack: bool) -> bool:
    """A plain nn.Linear (no subclass: a quantized or adapted layer keeps its own forward) on the CPU,
    with a weight too large to stay in a core's cache (CACHED_WEIGHT), float32, or bfloat16 where it
    will be packed (PyTorch's own bfloat16 product is the slower one at every row count)."""
    if type(module) is not nn.Linear or module.weight.device.type != "cpu" or module.weight.numel() < CACHED_WEIGHT:
        return False
    dtype = module.weight.dtype
    return dtype == torch.float32 or (pack and dtype == torch.bfloat16 and worth_packing(module))


def worth_packing(layer: nn.Linear) -> bool:
    """A plain weight (not a tensor subclass: a quantized one keeps its own kernels) too large to stay
    in a core's cache, in a dtype oneDNN runs here."""
    weight = layer.weight
    return (type(weight.data) is torch.Tensor and weight.numel() >= CACHED_WEIGHT
            and can_pack(weight.dtype))


def large_layers(model: nn.Module, pack: bool) -> list[nn.Linear]:
    """The layers of `model` a twin made with `pack` would pack (where they fit: pack_fits)."""
    return [m for m in model.modules() if qualifies(m, pack) and worth_packing(m)]


def pack_fits(layers: list[nn.Linear]) -> bool:
    """There are layers to pack, and packed copies of their weights (those not packed already) fit in
    PACK_SHARE of the free memory."""
    if not layers:
        return False
    new = {id(m.weight): m.weight for m in layers
           if (held := _PACKED.get(m.weight)) is None or held[0] != stamp(m.weight) or held[1]() is None}
    free = free_memory()
    return free is None or sum(w.numel() * w.element_size() for w in new.values()) <= PACK_SHARE * free


def row_twin(model: nn.Module, pack: bool | None = None) -> nn.Module | None:
    """The model's twin with RowLinear layers, or None when it has no layer that qualifies. With
    `pack` (default: the `packed_linear` setting, PACK), its large layers run oneDNN's kernel on
    packed copies of their weights, made here (where they fit in memory: pack_fits). The top module
    is a plain copy, so hooks put on the model later (a forward meter's) see the twin's forwards
    too; every module below has registries of its own (specdec.models.shallow_module), so what
    Hugging Face hooks into the layers it calls for recorded outputs is installed once in each."""
    pack = PACK if pack is None else pack
    pack = pack and pack_fits(large_layers(model, pack))

    def twin(module: nn.Module, top: bool = False) -> nn.Module:
        if qualifies(module, pack):
            layer = shallow_module(module)
            layer.__class__ = RowLinear
            if pack and worth_packing(module):
                layer.packed = True
                layer._held = packed_weight(module.weight)     # now, not inside a timed step
            return layer
        shell = copy.copy(module) if top else shallow_module(module)
        shell._modules = {name: None if child is None else twin(child) for name, child in module._modules.items()}
        return shell

    result = twin(model, top=True)
    return result if any(isinstance(module, RowLinear) for module in result.modules()) else None


def pack_layers(module: nn.Module) -> int:
    """Give a module of specdec's own (a drafter, not a user's model: its layers change class in place)
    packed weights in its large CPU linear layers, as row_twin gives a twin (where they fit in memory
    and the `packed_linear` setting is on). Every other linear layer, one packed before included (the
    setting turned off, the module moved to another device), is a plain nn.Linear again. Returns the
    number of layers that run packed."""
    linears = [m for m in module.modules() if type(m) in (nn.Linear, RowLinear)]
    large = [m for m in linears if m.weight.device.type == "cpu" and worth_packing(m)]
    pack = PACK and pack_fits(large)
    packed = {id(m) for m in large} if pack else set()
    for layer in linears:
        if id(layer) in packed:
            layer.__class__, layer.packed = RowLinear, True
            layer._held = packed_weight(layer.weight)
        else:
            layer.__class__ = nn.Linear
            for name in ("packed", "_held"):          # and the copy it held, freed
                layer.__dict__.pop(name, None)
    return len(packed)
