"""The EAGLE drafter file format, the heads' conventions: a folder with `eagle.safetensors` (the
drafter's own weights, never the target's shared lm_head or embedding) and `eagle.json`.

    eagle.json = {"format": "specdec-eagle-drafter", "version": 1,
                  "layout": {hidden_size, vocab_size, num_heads, intermediate_size, feature_layers,
                             rope_theta, norm_eps},
                  "target": {architecture, hidden_size, vocab_size, fingerprint: [floats]},
                  "training": {...}}

The target fingerprint is the heads' (specdec.heads.io): a drafter only loads on the exact target
it was trained for. Weights first, config last, each written atomically.
"""
from __future__ import annotations

import torch
from torch import nn

from .eagle import EagleDrafter, EagleLayout
from .io import DrafterFiles, load_drafter, read_drafter_config, save_drafter

WEIGHTS_FILE = "eagle.safetensors"
CONFIG_FILE = "eagle.json"
FORMAT = "specdec-eagle-drafter"
TRAIN_HINT = "`specdec train-heads train_eagle target=/path/to/it output_dir=...`"


EAGLE_FILES = DrafterFiles("EAGLE drafter", "eagle.path", WEIGHTS_FILE, CONFIG_FILE, FORMAT, EagleLayout, TRAIN_HINT)


def save_eagle(folder: str, drafter: EagleDrafter, target, training: dict | None = None) -> str:
    return save_drafter(EAGLE_FILES, folder, drafter, target, training)


def read_eagle_config(folder: str) -> dict:
    return read_drafter_config(EAGLE_FILES, folder)


def load_eagle(folder: str, target=None) -> EagleDrafter:
    """The drafter in `folder`; with `target`, checked against it and bound to it."""
    drafter, _ = load_drafter(EAGLE_FILES, folder, EagleDrafter, target)
    if target is not None:
        bind_eagle(drafter, target)
    return drafter.eval()


def bind_eagle(drafter: EagleDrafter, target, dtype: torch.dtype | None = None) -> EagleDrafter:
    """Move the drafter to the target's device and to `dtype` (None: the target's); share the target's
    lm_head and input embedding (in another dtype than the target's: a copy of the lm_head in it,
    vocab x hidden values, not saved; the embedding is read as is and cast)."""
    dtype = dtype or target.dtype
    drafter.to(device=target.device, dtype=dtype)
    lm_head = target.get_output_embeddings()
    if lm_head.weight.dtype != dtype:
        copy = nn.Linear(lm_head.in_features, lm_head.out_features, bias=lm_head.bias is not None,
                         device=lm_head.weight.device, dtype=dtype)
        with torch.no_grad():
            copy.load_state_dict(lm_head.state_dict())
        lm_head = copy.requires_grad_(False)
    drafter.attach_lm_head(lm_head)
    drafter.attach_embedding(target.get_input_embeddings())
    return drafter


def drafter_dtype(requested: str | torch.dtype | None, target) -> torch.dtype:
    """The dtype a drafter runs in beside `target`: None = the target's; a name or dtype; "auto" =
    bfloat16 when the target runs in float32 and bfloat16 is measured faster for the drafter's
    largest matmul (its lm_head over a tree level) on the target's device, else the target's.
    Only what is drafted changes: the target verifies in its own dtype (greedy identity holds;
    sampled trees carry the distributions they were drawn from)."""
    if requested is None:
        return target.dtype
    if requested != "auto":
        return requested if isinstance(requested, torch.dtype) else getattr(torch, requested)
    if target.dtype != torch.float32:
        return target.dtype
    from specdec.costmodel import bfloat16_pays
    head = target.get_output_embeddings()
    pays = bfloat16_pays(str(target.device), 8, head.in_features, head.out_features, torch.get_num_threads())
    return torch.bfloat16 if pays else target.dtype
