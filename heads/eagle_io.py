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


def bind_eagle(drafter: EagleDrafter, target) -> EagleDrafter:
    """Move the drafter to the target's device and dtype; share its lm_head and input embedding."""
    drafter.to(device=target.device, dtype=target.dtype)
    drafter.attach_lm_head(target.get_output_embeddings())
    drafter.attach_embedding(target.get_input_embeddings())
    return drafter
