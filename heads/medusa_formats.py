"""Medusa heads in the layouts other tools read and write.

Two foreign layouts hold the same module as ours (K heads, each `num_layers` residual blocks
x + SiLU(W x + b) on the target's last hidden state after its final norm, then a [V, H]
projection; head i guesses the token i + 2 positions after the hidden state's):

* `medusa` - FasterDecoding's reference (medusa/model/medusa_model.py): a folder with
  `config.json` ({medusa_num_heads, medusa_num_layers, base_model_name_or_path}) and
  `medusa_lm_head.pt` (torch.save) or `medusa_lm_head.safetensors`, keys `{i}.{j}.linear.weight|bias`
  for block j of head i and `{i}.{num_layers}.weight` for its own [V, H] projection (every head has
  one, initialised from the target's lm_head). Their blocks are built as `[ResBlock(H)] * L`, one
  module repeated, so the L blocks of a head hold equal tensors; read into L separate blocks, the
  forward is the same.
* `vllm` - vLLM's Medusa model (vllm/model_executor/models/medusa.py, its config
  vllm/transformers_utils/configs/medusa.py): `config.json` ({model_type: medusa, hidden_size,
  vocab_size, num_heads, num_hidden_layers, medusa_fc_bias, original_lm_head,
  truncated_vocab_size}) and safetensors with `blocks.{i}.layers.{j}.weight` (`.bias` when
  medusa_fc_bias), `lm_heads.{i}.weight` (one shared `lm_heads.0.weight` when original_lm_head),
  keys optionally prefixed `medusa_heads.`.

Neither layout records which exact model the heads were trained on (ours does, with a weight
fingerprint), so an imported file is checked against the target by shape only. Token-conditioned
heads (ours, layout.token_conditioned) read the embedding of the drafted parent token: no other
tool runs them, so exporting them is refused.
"""
from __future__ import annotations

import os
import re

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.atomic import atomic_write, atomic_write_json
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.interop.files import read_json
from specdec.models import output_vocab_size

from .module import CONFIG_FILE, HeadsLayout, MedusaHeads, bind_heads

FOREIGN_FORMATS = ("medusa", "vllm")
MEDUSA_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_WEIGHTS = "model.safetensors"
VLLM_PREFIX = "medusa_heads."


# ---------------------------------------------------------------------- detection
def detect_heads_format(folder: str) -> str | None:
    """"specdec" (heads.json), "medusa" (FasterDecoding's medusa_lm_head.*), "vllm" (config.json with
    model_type medusa), or None when the folder holds none of them."""
    if os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        return "specdec"
    if any(os.path.isfile(os.path.join(folder, name)) for name in MEDUSA_WEIGHTS):
        return "medusa"
    config = os.path.join(folder, "config.json")
    if os.path.isfile(config) and read_json(config).get("model_type") == "medusa":
        return "vllm"
    return None


# ---------------------------------------------------------------------- reading
def _load_tensors(path: str) -> dict[str, torch.Tensor]:
    try:
        if path.endswith(".safetensors"):
            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, ValueError, EOFError) as exc:
        raise ModelLoadError(f"{path} is corrupt or truncated ({exc})") from exc
    if not isinstance(state, dict):
        raise ModelLoadError(f"{path} does not hold a state dict (a {type(state).__name__})")
    return state


def _strip(state: dict, prefix: str) -> dict:
    return {name[len(prefix):] if name.startswith(prefix) else name: t for name, t in state.items()}


def _need(state: dict, name: str, where: str) -> torch.Tensor:
    if name not in state:
        raise ModelLoadError(f"{where}: tensor {name!r} is missing (it holds {sorted(state)[:6]}...): "
                             f"is it a complete checkpoint?")
    return state[name]


def _medusa_state(folder: str) -> tuple[HeadsLayout, dict, str]:
    """FasterDecoding's layout -> (our layout, our state dict, the base model it names)."""
    weights = next(os.path.join(folder, n) for n in MEDUSA_WEIGHTS if os.path.isfile(os.path.join(folder, n)))
    state = _strip(_load_tensors(weights), "medusa_head.")
    config_path = os.path.join(folder, "config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    heads = sorted({int(m.group(1)) for name in state if (m := re.match(r"(\d+)\.", name))})
    if not heads or heads != list(range(len(heads))):
        raise ModelLoadError(f"{weights}: no Medusa heads `0.*`, `1.*`, ... in it (keys {sorted(state)[:6]})")
    num_heads = int(config.get("medusa_num_heads", len(heads)))
    num_layers = int(config.get("medusa_num_layers",
                                max(int(n.split(".")[1]) for n in state if n.startswith("0.")) ))
    if num_heads > len(heads):
        raise ModelLoadError(f"{config_path} says medusa_num_heads={num_heads}, {weights} holds {len(heads)} heads")
    ours = {}
    for i in range(num_heads):
        for j in range(num_layers):
            for part in ("weight", "bias"):
                name = f"{i}.{j}.linear.{part}"
                if part == "bias" and name not in state:     # a head built without bias
                    ours[f"blocks.{i}.{j}.linear.bias"] = torch.zeros(_need(state, f"{i}.{j}.linear.weight", weights).shape[0])
                else:
                    ours[f"blocks.{i}.{j}.linear.{part}"] = _need(state, name, weights)
        ours[f"lm_heads.{i}.weight"] = _need(state, f"{i}.{num_layers}.weight", weights)
    vocab, hidden = ours["lm_heads.0.weight"].shape
    layout = HeadsLayout(num_heads, num_layers, hidden, vocab, own_lm_head=True)
    return layout, ours, str(config.get("base_model_name_or_path", "?"))


def _vllm_state(folder: str, target) -> tuple[HeadsLayout, dict, str]:
    """vLLM's layout -> (our layout, our state dict, a name for messages)."""
    config_path = os.path.join(folder, "config.json")
    config = read_json(config_path)
    try:
        hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
        num_heads, num_layers = int(config["num_heads"]), int(config.get("num_hidden_layers", 1))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{config_path}: not a vLLM Medusa config ({exc!r} missing or not a number)") from exc
    truncated = int(config.get("truncated_vocab_size") or vocab)
    if truncated != vocab:
        raise ModelLoadError(f"{config_path}: truncated_vocab_size {truncated} < vocab_size {vocab} (a token_map "
                             f"draft vocabulary) is not run by specdec's medusa: export the heads without truncation")
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not files:
        raise ModelLoadError(f"vLLM Medusa folder {folder!r} has config.json but no *.safetensors weights")
    state: dict = {}
    for name in files:
        state.update(_load_tensors(os.path.join(folder, name)))
    state = _strip(state, VLLM_PREFIX)
    shared = bool(config.get("original_lm_head", False))
    ours = {}
    for i in range(num_heads):
        for j in range(num_layers):
            weight = _need(state, f"blocks.{i}.layers.{j}.weight", folder)
            ours[f"blocks.{i}.{j}.linear.weight"] = weight
            ours[f"blocks.{i}.{j}.linear.bias"] = state.get(f"blocks.{i}.layers.{j}.bias",
                                                            torch.zeros(weight.shape[0], dtype=weight.dtype))
        ours[f"lm_heads.{i}.weight"] = _need(state, "lm_heads.0.weight" if shared else f"lm_heads.{i}.weight", folder)
    layout = HeadsLayout(num_heads, num_layers, hidden, vocab, own_lm_head=True)
    if shared and target is not None and _is_targets_lm_head(ours["lm_heads.0.weight"], target):
        # The one shared projection is the target's own: use it in place (no K copies of [V, H]).
        layout = HeadsLayout(num_heads, num_layers, hidden, vocab, own_lm_head=False)
        ours = {name: t for name, t in ours.items() if not name.startswith("lm_heads.")}
    return layout, ours, str(config.get("base_model_name_or_path") or config.get("_name_or_path") or folder)


def _is_targets_lm_head(weight: torch.Tensor, target) -> bool:
    lm_head = target.get_output_embeddings()
    return (lm_head is not None and getattr(lm_head, "bias", None) is None and lm_head.weight.shape == weight.shape
            and torch.equal(lm_head.weight.detach().to("cpu", weight.dtype), weight))


def import_heads(folder: str, target=None, kind: str | None = None) -> MedusaHeads:
    """Heads in a foreign layout (FasterDecoding's or vLLM's) as our MedusaHeads, checked against
    `target`'s hidden size and vocabulary (and bound to it when given). kind: the layout when the
    caller has detected it already (detect_heads_format)."""
    kind = kind or detect_heads_format(folder)
    if kind not in FOREIGN_FORMATS:
        raise ModelLoadError(f"{folder!r} holds no Medusa heads in a layout specdec imports (FasterDecoding's "
                             f"medusa_lm_head.pt/.safetensors + config.json, or vLLM's config.json with "
                             f"model_type=medusa + safetensors)")
    layout, state, named = _medusa_state(folder) if kind == "medusa" else _vllm_state(folder, target)
    if target is not None:
        hidden, vocab = int(target.config.hidden_size), output_vocab_size(target)
        if (layout.hidden_size, layout.vocab_size) != (hidden, vocab):
            raise IncompatibleModelsError(
                f"the {kind} Medusa heads in {folder!r} (trained for {named}) have hidden size {layout.hidden_size} "
                f"and vocabulary {layout.vocab_size}, but this target has {hidden} and {vocab}: load the target "
                f"they were trained for")
    heads = MedusaHeads(layout)
    try:
        heads.load_state_dict({name: t.float() for name, t in state.items()}, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"the {kind} Medusa heads in {folder!r} do not have the shapes their config gives "
                             f"({exc})") from exc
    heads.imported_from = {"format": kind, "folder": folder, "trained_for": named}
    if target is not None:
        bind_heads(heads, target)
    return heads.eval()


# ---------------------------------------------------------------------- writing
def _projections(heads: MedusaHeads, target) -> list[torch.Tensor]:
    """Each head's [V, H] projection: its own, or the target's lm_head that it shares."""
    if heads.lm_heads is not None:
        return [h.weight.detach() for h in heads.lm_heads]
    if target is None:
        raise ConfigError("these heads use the target's own lm_head, which their file does not hold: give the "
                          "target (--target /path/to/it) so its lm_head is written beside them")
    lm_head = target.get_output_embeddings()
    if lm_head is None or getattr(lm_head, "bias", None) is not None:
        raise ConfigError("the target's output layer is not a bias-free Linear: Medusa files cannot hold it")
    return [lm_head.weight.detach()] * heads.num_heads


def _check_exportable(heads: MedusaHeads, format: str) -> None:
    if heads.layout.token_conditioned:
        raise ConfigError("these heads are token-conditioned (each head also reads the drafted token before the "
                          "one it guesses): vLLM and FasterDecoding's Medusa run plain heads only. Train heads "
                          "for export with `specdec train-heads token_conditioned=false ...`")
    if format == "medusa" and heads.layout.num_layers > 1:
        # FasterDecoding repeats ONE block module L times, so its loader keeps only the last block's
        # tensors: heads whose blocks differ would run differently there.
        for head in heads.blocks:
            first = head[0].linear.state_dict()
            if any(not all(torch.equal(first[k], block.linear.state_dict()[k]) for k in first) for block in head[1:]):
                raise ConfigError("FasterDecoding's Medusa shares one residual block across a head's "
                                  f"{heads.layout.num_layers} layers, and these heads' blocks differ: export "
                                  "--format vllm, or train heads with num_layers=1 for that layout")


def export_heads(heads: MedusaHeads, out: str, format: str = "vllm", target=None,
                 base_model: str | None = None) -> str:
    """Write `heads` into `out` in a foreign layout ("vllm" or "medusa"); weights first, config last,
    each atomically. `target`: needed for heads that share its lm_head (the projection is written
    out, as both layouts hold one per head); `base_model`: the name recorded for the target."""
    if format not in FOREIGN_FORMATS:
        raise ConfigError(f"unknown Medusa export format {format!r}: choose one of {', '.join(FOREIGN_FORMATS)}")
    _check_exportable(heads, format)
    layout = heads.layout
    projections = _projections(heads, target)
    blocks = heads.blocks
    def cpu(t):       # a copy of its own: safetensors refuses tensors that share memory (the shared lm_head)
        return t.detach().to("cpu", torch.float32).clone().contiguous()
    if format == "vllm":
        # One projection for all heads (vLLM's original_lm_head) when they share the target's, or
        # hold equal copies of one (as an imported original_lm_head file does).
        shared = heads.lm_heads is None or all(torch.equal(projections[0], p) for p in projections[1:])
        state = {}
        for i in range(layout.num_heads):
            for j in range(layout.num_layers):
                state[f"blocks.{i}.layers.{j}.weight"] = cpu(blocks[i][j].linear.weight)
                state[f"blocks.{i}.layers.{j}.bias"] = cpu(blocks[i][j].linear.bias)
            if not shared or i == 0:
                state[f"lm_heads.{i}.weight"] = cpu(projections[i])
        config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": layout.hidden_size,
                  "vocab_size": layout.vocab_size, "num_heads": layout.num_heads,
                  "num_hidden_layers": layout.num_layers, "truncated_vocab_size": layout.vocab_size,
                  "medusa_fc_bias": True, "original_lm_head": shared, "torch_dtype": "float32"}
        if base_model:
            config["base_model_name_or_path"] = base_model
        weights_name = VLLM_WEIGHTS
    else:
        state = {}
        for i in range(layout.num_heads):
            for j in range(layout.num_layers):
                state[f"{i}.{j}.linear.weight"] = cpu(blocks[i][j].linear.weight)
                state[f"{i}.{j}.linear.bias"] = cpu(blocks[i][j].linear.bias)
            state[f"{i}.{layout.num_layers}.weight"] = cpu(projections[i])
        config = {"medusa_num_heads": layout.num_heads, "medusa_num_layers": layout.num_layers,
                  "base_model_name_or_path": base_model or "?"}
        weights_name = MEDUSA_WEIGHTS[0]
    os.makedirs(out, exist_ok=True)
    atomic_write(os.path.join(out, weights_name), lambda tmp: save_file(state, tmp))
    atomic_write_json(os.path.join(out, "config.json"), config, indent=2)
    return out
