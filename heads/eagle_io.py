"""The EAGLE drafter file format, the heads' conventions: a folder with `eagle.safetensors` (the
drafter's own weights, never the target's shared lm_head or embedding) and `eagle.json`.

    eagle.json = {"format": "specdec-eagle-drafter", "version": 1,
                  "layout": {hidden_size, vocab_size, num_heads, intermediate_size, feature_layers,
                             rope_theta, norm_eps}            (EAGLE-1, specdec.heads.eagle)
                            | {"style": "eagle3", ...}         (standard EAGLE-3, specdec.heads.eagle3;
                                                               weights under speculators' names),
                  "target": {architecture, hidden_size, vocab_size, fingerprint: [floats]},
                  "training": {...}}

The target fingerprint is the heads' (specdec.heads.io): a drafter only loads on the exact target
it was trained for. Weights first, config last, each written atomically.
"""
from __future__ import annotations

import copy
import os
import time

import torch
from torch import nn

from specdec.cache import BufferedLayer
from specdec.errors import ConfigError
from specdec.int8_linear import ACTIVATIONS, INT8, Int8Linear, int8_supported, quantizable, quantize_linears
from specdec.models import has_native_bf16
from specdec.row_linear import pack_layers, row_twin, runs_packed

from .eagle import EagleDrafter, EagleLayout
from .eagle3 import Eagle3Drafter, Eagle3Layout
from .eagle_formats import import_eagle3
from .io import DrafterFiles, load_drafter, read_drafter_config, save_drafter

WEIGHTS_FILE = "eagle.safetensors"
CONFIG_FILE = "eagle.json"
FORMAT = "specdec-eagle-drafter"
TRAIN_HINT = "`specdec train-heads train_eagle target=/path/to/it output_dir=...`"


def eagle_layout(**fields) -> EagleLayout | Eagle3Layout:
    """The layout a saved `layout` dict describes: {"style": "eagle3", ...} the standard EAGLE-3 one."""
    return Eagle3Layout(**fields) if fields.get("style") == "eagle3" else EagleLayout(**fields)


def drafter_for_layout(layout: EagleLayout | Eagle3Layout) -> EagleDrafter | Eagle3Drafter:
    """A drafter of `layout` (random weights)."""
    return Eagle3Drafter(layout) if isinstance(layout, Eagle3Layout) else EagleDrafter(layout)


EAGLE_FILES = DrafterFiles("EAGLE drafter", "eagle.path", WEIGHTS_FILE, CONFIG_FILE, FORMAT, eagle_layout, TRAIN_HINT)


def save_eagle(folder: str, drafter: EagleDrafter, target, training: dict | None = None) -> str:
    return save_drafter(EAGLE_FILES, folder, drafter, target, training)


def read_eagle_config(folder: str) -> dict:
    return read_drafter_config(EAGLE_FILES, folder)


def load_eagle(folder: str, target=None) -> EagleDrafter | Eagle3Drafter:
    """The drafter in `folder`; with `target`, checked against it and bound to it. A folder holding
    an EAGLE-3 checkpoint of `speculators` or of the EAGLE repository (no eagle.json) is imported
    (specdec.heads.eagle_formats)."""
    if folder and os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        drafter = import_eagle3(folder, target)
        if target is not None:
            bind_eagle(drafter, target)
        return drafter.eval()
    drafter, _ = load_drafter(EAGLE_FILES, folder, drafter_for_layout, target)
    if target is not None:
        bind_eagle(drafter, target)
    return drafter.eval()


def bind_eagle(drafter: EagleDrafter | Eagle3Drafter, target, dtype: torch.dtype | str | None = None):
    """Move the drafter to the target's device and to `dtype` (None: the target's; INT8: int8 weights,
    bfloat16 activations, specdec.int8_linear); share the target's lm_head (EAGLE-1; in another dtype
    than the target's: a copy of it in that dtype, vocab x hidden values, not saved) and input embedding
    (read as is and cast)."""
    quantized = dtype == INT8
    dtype = ACTIVATIONS if quantized else (dtype or target.dtype)
    drafter.to(device=target.device, dtype=dtype)
    if quantized:
        quantize_linears(drafter)
    else:
        # on a CPU its large linear layers run oneDNN's kernel on packed weights (specdec.row_linear): a
        # tree level's forward of a few rows then costs about what one row does
        pack_layers(drafter)
    for block in drafter.modules():
        if hasattr(block, "group_projections"):
            block.group_projections()
    drafter.attach_embedding(target.get_input_embeddings())
    if not drafter.uses_target_lm_head:
        return drafter
    lm_head = target.get_output_embeddings()
    if quantized and quantizable(lm_head):
        lm_head = Int8Linear.of(lm_head)           # the drafter's own copy, on the target's device
    elif lm_head.weight.dtype != dtype:      # (int8 asked of a layer too narrow for it: a bfloat16 copy)
        head_copy = nn.Linear(lm_head.in_features, lm_head.out_features, bias=lm_head.bias is not None,
                              device=lm_head.weight.device, dtype=dtype)
        with torch.no_grad():
            head_copy.load_state_dict(lm_head.state_dict())
        lm_head = head_copy.requires_grad_(False)
        pack_layers(lm_head)                       # the drafter's own copy
    elif runs_packed(twin := row_twin(lm_head)):   # the target's own layer: never changed, twinned
        lm_head = twin
    drafter.attach_lm_head(lm_head)
    return drafter


_CPU_DTYPE: dict[tuple, torch.dtype | str] = {}     # (device, layout, threads) -> the dtype measured fastest
# int8 weights are taken by "auto" where a tree-level forward measures at least this much faster than in bfloat16:
# the measurement is hot, and a forward in a decode loop runs on cold caches, where int8's halved bytes gain more
INT8_MARGIN = 1.05


def drafter_dtype(requested: str | torch.dtype | None, target, drafter: EagleDrafter) -> torch.dtype | str:
    """The dtype a drafter runs in beside `target`: None = the target's; a name or dtype; "auto" =
    bfloat16 when the target runs in float32 and bf16 pays on its device: on CUDA when supported,
    on a CPU with bf16 dot products when a tree-level forward of `drafter` is measured >= 1.25x
    faster in bf16 (tiny drafters run slower; CPUs without them emulate bf16, never faster), and then INT8
    (int8 weights, bfloat16 activations: specdec.int8_linear) where that forward measures INT8_MARGIN
    faster still. Only what is drafted changes: the target verifies in its own dtype (greedy identity holds;
    sampled trees carry the distributions they were drawn from). "int8" asked where it cannot run is refused."""
    if requested is None:
        return target.dtype
    if requested == INT8:
        if not int8_supported(target.device):
            raise ConfigError(f"eagle.dtype: int8 runs the drafter's linear layers on torch's CPU int8 kernel, and the "
                              f"target is on {target.device} (or this torch lacks the kernel): use eagle.dtype "
                              f"bfloat16 or auto")
        return INT8
    if requested != "auto":
        return requested if isinstance(requested, torch.dtype) else getattr(torch, requested)
    if target.dtype != torch.float32:
        return target.dtype
    if not has_native_bf16(target.device):
        # e.g. a CPU without bf16 dot products (AVX512-BF16 / AMX) emulates them: never faster, and a
        # timing taken on a loaded machine could say otherwise
        return target.dtype
    if target.device.type == "cuda":
        return torch.bfloat16
    key = (str(target.device), drafter.layout, torch.get_num_threads())
    if key not in _CPU_DTYPE:
        seconds = {dtype: _tree_level_seconds(drafter, target, dtype) for dtype in (torch.float32, torch.bfloat16)}
        chosen = torch.bfloat16 if seconds[torch.float32] >= 1.25 * seconds[torch.bfloat16] else target.dtype
        if chosen == torch.bfloat16 and int8_supported(target.device):
            if INT8_MARGIN * _tree_level_seconds(drafter, target, INT8) <= seconds[torch.bfloat16]:
                chosen = INT8
        _CPU_DTYPE[key] = chosen
    return _CPU_DTYPE[key]


@torch.inference_mode()
def _tree_level_seconds(drafter: EagleDrafter, target, dtype: torch.dtype | str, rows: int = 4, past: int = 128,
                        repeats: int = 10) -> float:
    """Best-of-3 time of `repeats` drafter forwards over `rows` tree nodes after `past` committed rows,
    on a copy of the drafter in `dtype` (a few ms on a CPU)."""
    trial = bind_eagle(copy.deepcopy(drafter), target, dtype)
    dtype = ACTIVATIONS if dtype == INT8 else dtype
    hidden = drafter.layout.width
    cache = BufferedLayer()
    trial(torch.randn(1, past, hidden, dtype=dtype), torch.zeros(1, past, dtype=torch.long),
          torch.arange(past)[None], with_logits=False, cache=cache, start=0)
    g = torch.randn(1, rows, hidden, dtype=dtype)
    tokens, positions = torch.zeros(1, rows, dtype=torch.long), torch.full((1, rows), past)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            trial(g, tokens, positions, cache=cache, start=past)
        best = min(best, time.perf_counter() - start)
    return best
