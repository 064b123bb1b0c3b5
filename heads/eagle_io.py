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

import json
import os

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.errors import IncompatibleModelsError, ModelLoadError

from .eagle import EagleDrafter, EagleLayout
from .io import _write_json, atomic_write, fingerprints_match, target_identity

WEIGHTS_FILE = "eagle.safetensors"
CONFIG_FILE = "eagle.json"
FORMAT = "specdec-eagle-drafter"
VERSION = 1
TRAIN_HINT = "`specdec train-heads train_eagle target=/path/to/it output_dir=...`"


def check_drafter_fits_target(info: dict, target, where: str = "this EAGLE drafter") -> None:
    """IncompatibleModelsError naming what differs between the drafter's target and `target`."""
    current = target_identity(target)
    for field in ("architecture", "hidden_size", "vocab_size"):
        if info.get(field) != current[field]:
            raise IncompatibleModelsError(
                f"{where} was trained for a target with {field}={info.get(field)!r}, but this target has "
                f"{field}={current[field]!r}: train a drafter for this model with {TRAIN_HINT}, or load the "
                f"target it belongs to")
    if not fingerprints_match(info.get("fingerprint", []), current["fingerprint"]):
        raise IncompatibleModelsError(
            f"{where} was trained for another model of the same shape ({current['architecture']}, hidden "
            f"{current['hidden_size']}, vocab {current['vocab_size']}): the weight fingerprint differs. A drafter "
            f"only works on the exact target it was trained on: train one with {TRAIN_HINT}, or load its target")


def save_eagle(folder: str, drafter: EagleDrafter, target, training: dict | None = None) -> str:
    state = {name: t.detach().to("cpu").contiguous() for name, t in drafter.state_dict().items()}
    atomic_write(os.path.join(folder, WEIGHTS_FILE), lambda tmp: save_file(state, tmp, metadata={"format": FORMAT}))
    _write_json(os.path.join(folder, CONFIG_FILE), {
        "format": FORMAT, "version": VERSION, "layout": drafter.layout.as_dict(),
        "target": target_identity(target), "training": training or {}})
    return folder


def read_eagle_config(folder: str) -> dict:
    if not folder:
        raise ModelLoadError(f"no EAGLE drafter given: set eagle.path=/folder/written/by/{TRAIN_HINT}")
    if not os.path.isdir(folder):
        raise ModelLoadError(f"EAGLE drafter folder {folder!r} does not exist: give eagle.path= the output folder "
                             f"of {TRAIN_HINT}")
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"EAGLE drafter folder {folder!r} has no {CONFIG_FILE}: is it the output folder of a "
                             f"finished {TRAIN_HINT} run?")
    try:
        with open(path) as f:
            config = json.load(f)
        EagleLayout(**config["layout"])
        config["target"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path} is corrupt or not a specdec EAGLE drafter config ({exc!r}): train the "
                             f"drafter again with {TRAIN_HINT}") from exc
    if config.get("format") != FORMAT:
        raise ModelLoadError(f"{path} is not a specdec EAGLE drafter config (format={config.get('format')!r})")
    return config


def load_eagle(folder: str, target=None) -> EagleDrafter:
    """The drafter in `folder`; with `target`, checked against it and bound to it."""
    config = read_eagle_config(folder)
    if target is not None:
        check_drafter_fits_target(config["target"], target, where=f"the EAGLE drafter in {folder!r}")
    weights = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise ModelLoadError(f"EAGLE drafter folder {folder!r} has {CONFIG_FILE} but no {WEIGHTS_FILE}: train it "
                             f"again with {TRAIN_HINT}")
    try:
        state = load_file(weights)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{weights} is corrupt or truncated ({exc}): train the drafter again with "
                             f"{TRAIN_HINT} (an interrupted run resumes from its checkpoint)") from exc
    drafter = EagleDrafter(EagleLayout(**config["layout"]))
    try:
        drafter.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{weights} does not hold the weights its {CONFIG_FILE} describes ({exc}): train "
                             f"the drafter again with {TRAIN_HINT}") from exc
    drafter.info = config
    if target is not None:
        bind_eagle(drafter, target)
    return drafter.eval()


def bind_eagle(drafter: EagleDrafter, target) -> EagleDrafter:
    """Move the drafter to the target's device and dtype; share its lm_head and input embedding."""
    drafter.to(device=target.device, dtype=target.dtype)
    drafter.attach_lm_head(target.get_output_embeddings())
    drafter.attach_embedding(target.get_input_embeddings())
    return drafter
