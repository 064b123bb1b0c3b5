"""The heads file format: a folder with `heads.safetensors` (the heads' own weights, never the
target's shared lm_head) and `heads.json` (the head layout and the target they were trained for).

    heads.json = {"format": "specdec-medusa-heads", "version": 1,
                  "layout": {num_heads, num_layers, hidden_size, vocab_size, own_lm_head,
                             token_conditioned (absent = false)},
                  "target": {architecture, hidden_size, vocab_size, fingerprint: [floats]},
                  "training": {...free-form notes...}}

The fingerprint is a few numbers computed from fixed rows of the target's input embedding and
lm_head (dot products with a fixed vector), compared with a tolerance so the same target loaded
in fp32, fp16 or bf16 still matches while another model does not. Saves are atomic.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.atomic import atomic_write, atomic_write_json
from specdec.errors import IncompatibleModelsError, ModelLoadError
from specdec.models import output_vocab_size as output_vocab

from .medusa_formats import FOREIGN_FORMATS, detect_heads_format, import_heads
from .module import CONFIG_FILE, WEIGHTS_FILE, HeadsLayout, MedusaHeads, bind_heads

FORMAT = "specdec-medusa-heads"
VERSION = 1
FINGERPRINT_ROWS = 8
FINGERPRINT_RTOL = 2e-2         # bf16 keeps ~3 significant digits; another model is far off


# ---------------------------------------------------------------------- target identity
def target_fingerprint(target) -> list[float]:
    """2 * FINGERPRINT_ROWS numbers: fixed rows of the input embedding and of the lm_head, each
    projected on a fixed vector (fp32)."""
    numbers = []
    for layer in (target.get_input_embeddings(), target.get_output_embeddings()):
        weight = layer.weight.detach()                                       # [V, H]
        vocab, hidden = weight.shape
        rows = torch.linspace(0, vocab - 1, FINGERPRINT_ROWS).long().to(weight.device)
        probe = torch.cos(torch.arange(hidden, dtype=torch.float32) * 0.7 + 0.1).to(weight.device)   # [H]
        numbers += (weight[rows].float() @ probe).tolist()                   # [ROWS]
    return [float(x) for x in numbers]


def target_identity(target) -> dict:
    config = target.config
    architectures = getattr(config, "architectures", None) or [type(target).__name__]
    return {"architecture": architectures[0], "hidden_size": int(config.hidden_size),
            "vocab_size": output_vocab(target), "fingerprint": target_fingerprint(target)}


def fingerprints_match(saved: list[float], current: list[float]) -> bool:
    if len(saved) != len(current):
        return False
    scale = max(1e-6, max(abs(x) for x in current + saved))
    return all(math.isclose(a, b, rel_tol=FINGERPRINT_RTOL, abs_tol=FINGERPRINT_RTOL * scale)
               for a, b in zip(saved, current))


@dataclass(frozen=True)
class DrafterFiles:
    """One drafter file format (Medusa heads, the EAGLE drafter): a folder with `weights_file`
    (safetensors, the drafter's own weights) and `config_file` (JSON: format, version, layout,
    target identity, training record). The functions below serve every such format."""
    what: str                  # "heads", "EAGLE drafter": how messages name it
    key: str                   # the config key that points at the folder
    weights_file: str
    config_file: str
    format: str
    layout_cls: type           # layout dataclass: layout_cls(**config["layout"])
    train_hint: str            # the command that (re)makes one


HEADS_FILES = DrafterFiles("heads", "heads.path", WEIGHTS_FILE, CONFIG_FILE, FORMAT, HeadsLayout,
                           "`specdec train-heads target=/path/to/it`")


def check_fits_target(files: DrafterFiles, info: dict, target, where: str) -> None:
    """IncompatibleModelsError naming the first field that differs between the target a drafter
    was trained for (`info` = its config's "target") and `target`."""
    current = target_identity(target)
    for field in ("architecture", "hidden_size", "vocab_size"):
        if info.get(field) != current[field]:
            raise IncompatibleModelsError(
                f"{where}: trained for a target with {field}={info.get(field)!r}, but this target has "
                f"{field}={current[field]!r}. Train {files.what} for this model with {files.train_hint}, or "
                f"load the target it was trained for")
    if not fingerprints_match(info.get("fingerprint", []), current["fingerprint"]):
        raise IncompatibleModelsError(
            f"{where}: trained for another model of the same shape ({current['architecture']}, hidden "
            f"{current['hidden_size']}, vocab {current['vocab_size']}): the weight fingerprint differs. A drafter "
            f"only works on the exact target it was trained on: train {files.what} for this model with "
            f"{files.train_hint}, or load the target it was trained for")


def check_module_fits_target(files: DrafterFiles, module, target) -> None:
    """A drafter module about to serve `target`: loaded from a file (module.info), the exact target
    it was trained for; built in memory, at least the target's hidden size and vocabulary."""
    info = getattr(module, "info", None)
    if info is not None:
        check_fits_target(files, info["target"], target, where=f"the {files.what}")
        return
    current = target_identity(target)
    layout = module.layout
    if (layout.hidden_size, layout.vocab_size) != (current["hidden_size"], current["vocab_size"]):
        raise IncompatibleModelsError(
            f"the {files.what}: built for hidden size {layout.hidden_size} and vocabulary {layout.vocab_size}, "
            f"but the target has {current['hidden_size']} and {current['vocab_size']}: use {files.what} built for it")


def check_heads_fit_target(info: dict, target, where: str = "these heads") -> None:
    check_fits_target(HEADS_FILES, info, target, where)


# ---------------------------------------------------------------------- save / load
def save_drafter(files: DrafterFiles, folder: str, module, target, training: dict | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> str:
    """Write the weights (`state`, default: the module's state_dict), then the config (the config last: a
    folder with a config has weights that go with it)."""
    if state is None:
        state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in module.state_dict().items()}
    atomic_write(os.path.join(folder, files.weights_file),
                 lambda tmp: save_file(state, tmp, metadata={"format": files.format}))
    atomic_write_json(os.path.join(folder, files.config_file), {
        "format": files.format, "version": VERSION, "layout": module.layout.as_dict(),
        "target": target_identity(target), "training": training or {}}, indent=2)
    return folder


def read_drafter_config(files: DrafterFiles, folder: str) -> dict:
    if not folder:
        raise ModelLoadError(f"no {files.what} given: set {files.key}=/folder/written/by {files.train_hint}")
    path = os.path.join(folder, files.config_file)
    if not os.path.isdir(folder):
        raise ModelLoadError(f"{files.what} folder {folder!r} does not exist: give {files.key}= the output folder "
                             f"of {files.train_hint}")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{files.what} folder {folder!r} has no {files.config_file}: is it the output folder "
                             f"of a finished {files.train_hint} run?")
    try:
        with open(path) as f:
            config = json.load(f)
        files.layout_cls(**config["layout"])
        config["target"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path} is corrupt or not a specdec {files.what} config ({exc!r}): "
                             f"train again with {files.train_hint}") from exc
    if config.get("format") != files.format:
        raise ModelLoadError(f"{path} is not a specdec {files.what} config (format={config.get('format')!r})")
    return config


def load_drafter(files: DrafterFiles, folder: str, build, target=None):
    """(module, config) from `folder`: config read and checked against `target` (when given),
    module = build(layout) with the saved weights loaded strictly."""
    config = read_drafter_config(files, folder)
    if target is not None:
        check_fits_target(files, config["target"], target, where=f"the {files.what} in {folder!r}")
    weights = os.path.join(folder, files.weights_file)
    if not os.path.isfile(weights):
        raise ModelLoadError(f"{files.what} folder {folder!r} has {files.config_file} but no {files.weights_file}: "
                             f"train again with {files.train_hint}")
    try:
        state = load_file(weights)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{weights} is corrupt or truncated ({exc}): train again with {files.train_hint} "
                             f"(an interrupted run resumes from its checkpoint)") from exc
    module = build(files.layout_cls(**config["layout"]))
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{weights} does not hold the weights its {files.config_file} describes ({exc}): "
                             f"train again with {files.train_hint}") from exc
    module.info = config
    return module, config


def save_heads(folder: str, heads: MedusaHeads, target, training: dict | None = None) -> str:
    return save_drafter(HEADS_FILES, folder, heads, target, training)


def read_heads_config(folder: str) -> dict:
    return read_drafter_config(HEADS_FILES, folder)


def load_heads(folder: str, target=None) -> MedusaHeads:
    """Heads from `folder`; with `target`, checked against it and attached to its lm_head.
    A folder in FasterDecoding's or vLLM's Medusa layout (no heads.json) is imported
    (specdec.heads.medusa_formats)."""
    if folder and os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        kind = detect_heads_format(folder)
        if kind in FOREIGN_FORMATS:
            return import_heads(folder, target, kind)
    heads, _ = load_drafter(HEADS_FILES, folder, MedusaHeads, target)
    if target is not None:
        bind_heads(heads, target)
    return heads.eval()
