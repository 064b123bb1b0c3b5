"""Native multi-token-prediction (MTP) modules, as DeepSeek-V3/R1 and GLM-4.5 ship them.

The checkpoint holds them after the decoder's own layers, `model.layers.{L + i}.*` (enorm, hnorm,
eh_proj, shared_head, one decoder block) for i < num_nextn_predict_layers; Hugging Face's model drops
them at load. `load_mtp` reads them as the installed transformers' `MtpModel` reads them (its modules,
its weight conversions), stricter: a missing, extra or wrongly shaped tensor, or a shared head or
embedding that is not the target's, is refused with a message naming the tensor. Qwen3-Next's and
Qwen3.5's `mtp.*` layout is the same module under other names, read into the same MtpModel
(heads/mtp_prefixed.py).

`MtpDrafter` runs a module (module 0 unless told) with the call interface of specdec's EAGLE drafters (heads/eagle.py), so the
eagle strategy's chains, trees and sampling drive it: row t reads the target's feature at t (the last
hidden state, after the final norm: what Hugging Face's `use_mtp` feeds) and token t + 1, and its
output (after the module's post norm) is both the next row's feature and, through the shared head,
the guess for token t + 2. The same interface trains it (`specdec train mtp`, the EAGLE trainer with
layout=mtp: heads/eagle_train.py).

A target that ships no MTP modules can be given trained ones apart: a folder with `mtp.json` (the
target it was trained for, as the heads record it: heads/io.py) and `mtp.safetensors`, whose tensors
carry the checkpoint names above (model.layers.{L + i}.*; the shared head and embedding are the
target's and not stored). `load_mtp(target, modules=folder)` reads it with the same checks.

    mtp.json = {"format": "specdec-mtp-modules", "version": 1,
                "layout": {hidden_size, modules, feature_layers},
                "target": {architecture, hidden_size, vocab_size, fingerprint}, "training": {...}}
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import DynamicLayer

from specdec.errors import ModelLoadError

from . import mtp_prefixed
from .io import DrafterFiles, check_fits_target, read_drafter_config, save_drafter

CHECKPOINT_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
SHARED = {"shared_head.head.weight": "lm_head", "embed_tokens.weight": "input embedding"}
WEIGHTS_FILE = "mtp.safetensors"
CONFIG_FILE = "mtp.json"
FORMAT = "specdec-mtp-modules"
TRAIN_HINT = "`specdec train mtp train_mtp target=/path/to/it output_dir=...`"


def mtp_count(target) -> int:
    """The MTP modules the target's config announces (num_nextn_predict_layers / num_mtp_layers), 0 if none."""
    return int(getattr(target.config.get_text_config(decoder=True), "num_mtp_layers", None) or 0)


def checkpoint_tensors(folder: str) -> dict[str, str]:
    """{tensor name: safetensors file} of every tensor in the checkpoint folder."""
    from safetensors import safe_open
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ModelLoadError(f"mtp: no .safetensors file in {folder!r}: MTP modules are read from the target's "
                             f"safetensors checkpoint")
    found = {}
    for name in files:
        with safe_open(os.path.join(folder, name), framework="pt") as handle:
            found.update(dict.fromkeys(handle.keys(), name))
    return found


def _modules_in(tensors: dict[str, str], layers: int, count: int, folder: str) -> dict[int, list[str]]:
    """{module i: its checkpoint tensor names}; refuses tensors past the announced modules and modules
    with no tensor."""
    by_module: dict[int, list[str]] = {}
    for name in sorted(tensors):
        match = CHECKPOINT_LAYER.match(name)
        if match and int(match.group(1)) >= layers:
            by_module.setdefault(int(match.group(1)) - layers, []).append(name)
    extra = sorted(name for i, names in by_module.items() if i >= count for name in names)
    if extra:
        raise ModelLoadError(f"mtp: {folder!r} holds tensor {extra[0]!r} ({len(extra)} such), past the {count} MTP "
                             f"module(s) its config announces (layers {layers} .. {layers + count - 1}): the "
                             f"checkpoint and its config disagree")
    for i in range(count):
        if i not in by_module:
            raise ModelLoadError(f"mtp: {folder!r} has no tensor 'model.layers.{layers + i}.*' for MTP module {i} "
                                 f"(its config announces {count}): a checkpoint saved without its MTP weights")
    return by_module


def mtp_model_for(target, count: int, block_type: str | None = None):
    """A transformers MtpModel of `count` fresh modules (random weights) sharing `target`'s embedding, head and
    rotary embedding. A target whose config announces no MTP modules (a Llama) gets them all the same:
    MtpModel reads their number from the config, so it is given a copy of the config that announces them.
    block_type (the mtp.* layout: heads/mtp_prefixed.py): each module's decoder block is of that layer type
    (config.layer_types' names), and its norms are the decoder layer's own norm class."""
    from transformers.modeling_layers import MtpModel
    text = target.config.get_text_config(decoder=True)
    if block_type is None and getattr(text, "layer_types", None) and getattr(text, "mtp_layer_types", None) is None:
        # transformers' get_mtp_config refuses layer_types (Qwen2's, Gemma-2's sliding layers) without
        # mtp_layer_types: a module trained apart for such a target gets a full-attention block
        block_type = "full_attention"
    announced = target
    if mtp_count(target) != count or block_type is not None:
        announced = _Announcing(target, count, block_type)
    mtp = MtpModel(announced, count)
    if block_type is not None:
        _own_norms(mtp)
    with torch.no_grad():
        # MtpModel's own initialisation is the generic one, which leaves a MoE block's experts and router as
        # allocated (zeros, or NaNs) and zero-centred norms at 1: the target's initialisation knows its classes
        mtp.layers.apply(target._init_weights)
    mtp.tie_with_main_model(target)
    return mtp


def _own_norms(mtp) -> None:
    """MtpModel takes its norm class from the first norm inside the decoder's last layer, which on a hybrid model
    may be a linear-attention layer's gated norm: each module's norms become its block's input norm class."""
    for layer in mtp.layers:
        norm_class = type(layer.mtp_block.input_layernorm)
        for name in ("enorm", "hnorm", "post_norm"):
            norm = getattr(layer, name)
            if norm is not None and type(norm) is not norm_class:
                setattr(layer, name, norm_class(mtp.config.hidden_size, eps=mtp.config.rms_norm_eps))


class _Announcing:
    """`target` seen through a copy of its config that announces `count` MTP modules (for MtpModel's
    constructor, which reads them from the config; the target itself is left as it is), with blocks of
    `block_type` where given."""

    def __init__(self, target, count: int, block_type: str | None = None):
        import copy
        self.config = copy.deepcopy(target.config)
        text = self.config.get_text_config(decoder=True)
        text.num_mtp_layers = count
        if block_type is not None:
            text.mtp_layer_types = [block_type] * count
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)


@torch.no_grad()
def load_mtp(target, folder: str | None = None, modules: str | None = None):
    """The target's MTP modules (a transformers MtpModel sharing the target's embedding, head and rotary
    embedding), read from `folder` (default: the folder the target was loaded from); or, given `modules`,
    from that folder of modules trained apart for this target (mtp.json + mtp.safetensors). A checkpoint
    in the mtp.* layout (Qwen3-Next, Qwen3.5) is read as heads/mtp_prefixed.py says."""
    layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    if modules:
        count, folder, tensors = _separate_modules(target, modules)
    else:
        folder = folder or target.config.name_or_path
        count = mtp_count(target)
        prefixed = None if count else mtp_prefixed.find_layout(target, folder, checkpoint_tensors)
        if not count and prefixed is None:
            raise ModelLoadError(f"mtp: the target ({type(target).__name__}) announces no MTP modules (no "
                                 f"num_nextn_predict_layers or mtp_num_hidden_layers in its config): use a checkpoint "
                                 f"that ships them (DeepSeek-V3/R1, GLM-4.5, Qwen3-Next, Qwen3.5), give modules "
                                 f"trained for it (mtp.path=, made by {TRAIN_HINT}), or another strategy")
        if not folder or not os.path.isdir(folder):
            raise ModelLoadError(f"mtp: the MTP weights are read from the target's checkpoint folder, and {folder!r} "
                                 f"is not one: load the target from a folder (target.path)")
        tensors = prefixed or checkpoint_tensors(folder)      # read once: find_layout's, where it read them
        if prefixed is not None:
            names = mtp_prefixed.model_names(target, tensors, folder, TRAIN_HINT)    # {MtpModel name: checkpoint name}
            mtp = mtp_model_for(target, 1, mtp_prefixed.BLOCK_TYPE)
            return _read(mtp, target, folder, tensors, names, mtp_prefixed.checkpoint_name)
    by_module = _modules_in(tensors, layers, count, folder)
    names = {name: name for module_names in by_module.values() for name in module_names}
    return _read(mtp_model_for(target, count), target, folder, tensors, names,
                 lambda name: _checkpoint_name(name, layers))


def _read(mtp, target, folder: str, tensors: dict[str, str], names: dict[str, str], checkpoint_name):
    """Load the checkpoint tensors names.values() (files: tensors) into `mtp` under the names names.keys(),
    through transformers' weight conversions (its per-expert MoE tensors merged as the target's own are);
    refuse what is missing, unexpected or misshaped, naming its checkpoint_name()."""
    from safetensors import safe_open
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig
    layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    mtp = mtp.to(device=target.device, dtype=target.dtype)
    state_dict, handles = {}, {}
    for name, stored in names.items():
        file = tensors[stored]
        if file not in handles:
            handles[file] = safe_open(os.path.join(folder, file), framework="pt")
        state_dict[name] = handles[file].get_slice(stored)
        _check_shared(stored, handles[file].get_tensor(stored), target, layers, folder)
    info, _ = convert_and_load_state_dict_in_model(
        model=mtp, state_dict=state_dict,
        load_config=LoadStateDictConfig(weight_mapping=mtp.get_weight_conversions(target),
                                        device_map={"": target.device}, dtype=target.dtype))
    mtp._adjust_missing_and_unexpected_keys(info)
    _refuse(info, folder, checkpoint_name)
    mtp.tie_with_main_model(target)
    return mtp.eval()


def _separate_modules(target, folder: str) -> tuple[int, str, dict[str, str]]:
    """(module count, folder, {tensor name: file}) of a folder of MTP modules trained apart, after checking
    that they were trained for this target."""
    config = read_drafter_config(MTP_FILES, folder)
    check_fits_target(MTP_FILES, config["target"], target, where=f"mtp: the MTP modules in {folder!r}")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        raise ModelLoadError(f"mtp: {folder!r} has {CONFIG_FILE} but no {WEIGHTS_FILE}: train again with {TRAIN_HINT}")
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(os.path.join(folder, WEIGHTS_FILE), framework="pt") as handle:
            names = list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"mtp: {os.path.join(folder, WEIGHTS_FILE)} is corrupt or truncated ({exc}): train "
                             f"again with {TRAIN_HINT}") from exc
    strays = [name for name in names if not CHECKPOINT_LAYER.match(name)]
    if strays:
        raise ModelLoadError(f"mtp: {folder!r} holds tensor {strays[0]!r}, which is no MTP module's (their names are "
                             f"model.layers.{{num_hidden_layers + i}}.*)")
    return int(config["layout"]["modules"]), folder, dict.fromkeys(names, WEIGHTS_FILE)


def save_mtp(folder: str, drafter: "MtpDrafter", target, training: dict | None = None) -> str:
    """Write `drafter`'s modules to `folder` as load_mtp(target, modules=folder) reads them: their own tensors
    under the checkpoint names (model.layers.{L + i}.*), then mtp.json."""
    layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    state = {_checkpoint_name(f"layers.{name}", layers): tensor.detach().to("cpu").contiguous()
             for name, tensor in drafter.mtp.layers.state_dict().items()}
    return save_drafter(MTP_FILES, folder, drafter, target, training, state=state)


def _check_shared(name: str, tensor: torch.Tensor, target, layers: int, folder: str) -> None:
    """A module's copy of the shared head or embedding must be the target's own (else the checkpoint
    belongs to another target)."""
    match = CHECKPOINT_LAYER.match(name)
    what = SHARED.get(match.group(2)) if match else None
    if what is None:
        return
    own = (target.get_output_embeddings() if what == "lm_head" else target.get_input_embeddings()).weight
    if tensor.shape != own.shape or not torch.equal(tensor.to(device=own.device, dtype=own.dtype), own):
        raise ModelLoadError(f"mtp: tensor {name!r} in {folder!r} is not the target's {what} "
                             f"({tuple(tensor.shape)} vs {tuple(own.shape)}{'' if tensor.shape != own.shape else ', other values'}): "
                             f"these MTP modules belong to another target")


def _refuse(info, folder: str, checkpoint_name) -> None:
    """Refuse what Hugging Face's loading left missing, unexpected or misshaped, naming the tensor
    (checkpoint_name: an MtpModel parameter name -> the checkpoint's name for it)."""
    if info.conversion_errors:        # tensors merged on load (a MoE's per-expert ones) that did not merge
        name, error = sorted(info.conversion_errors.items())[0]
        cause = next((line for line in error.splitlines() if re.match(r"^\w+Error: ", line)), error.strip())
        raise ModelLoadError(f"mtp: the tensors that make {checkpoint_name(name)!r} in {folder!r} do not merge "
                             f"({cause}): one of them is missing or of another shape")
    if info.mismatched_keys:
        name, got, expected = sorted(info.mismatched_keys, key=str)[0]
        raise ModelLoadError(f"mtp: tensor {checkpoint_name(name)!r} in {folder!r} has shape {tuple(got)}, "
                             f"the target's MTP module needs {tuple(expected)}")
    if info.missing_keys:
        missing = sorted(info.missing_keys)
        raise ModelLoadError(f"mtp: {folder!r} lacks tensor {checkpoint_name(missing[0])!r} of an MTP module "
                             f"({len(missing)} missing: {', '.join(checkpoint_name(name) for name in missing[:4])})")
    if info.unexpected_keys:
        unexpected = sorted(info.unexpected_keys)
        raise ModelLoadError(f"mtp: {folder!r} holds tensor {checkpoint_name(unexpected[0])!r}, which no MTP module "
                             f"of this target has ({len(unexpected)} such)")


def _checkpoint_name(name: str, layers: int) -> str:
    """The checkpoint name of an MtpModel parameter name (layers.i.mtp_block.X -> model.layers.{L+i}.X)."""
    match = re.match(r"^layers\.(\d+)\.(?:mtp_block\.)?(.+)$", name)
    if not match:
        return name
    rest = match.group(2).replace("post_norm.", "shared_head.norm.")
    return f"model.layers.{layers + int(match.group(1))}.{rest}"


@dataclass(frozen=True)
class MtpLayout:
    """What the eagle strategy (and its trainer) reads of a drafter's layout."""
    hidden_size: int
    modules: int
    feature_layers: tuple[int, ...] = (-1,)     # the target's last hidden state, after its final norm

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))

    def as_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "modules": self.modules, "feature_layers": list(self.feature_layers)}


MTP_FILES = DrafterFiles("MTP modules", "mtp.path", WEIGHTS_FILE, CONFIG_FILE, FORMAT, MtpLayout, TRAIN_HINT)


class MtpDrafter(nn.Module):
    """The MTP modules behind the EAGLE drafter's call interface (heads/eagle.py EagleDrafter.forward): `module`
    picks which one runs (0 unless told)."""

    uses_target_lm_head = True
    draft_vocab = None

    def __init__(self, mtp, target_id: int):
        super().__init__()
        self.mtp = mtp
        self.target_id = target_id              # id() of the target it was read for
        self.layout = MtpLayout(int(mtp.config.hidden_size), len(mtp.layers))

    def input_features(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] module outputs -> [..., V] logits through the target's shared head."""
        return self.mtp._project_to_logits(out)

    draft_logits = logits

    def forward(self, g, tokens, positions, past_k=None, past_v=None, visible=None, with_logits: bool = True,
                cache=None, start: int = 0, module: int = 0):
        """g [B, n, H] features, tokens [B, n] the token after each feature's position, positions [B, n].
        Inference (B = 1): `cache` (a BufferedLayer) holds rows 0 .. start - 1 (rows after them, a rolled-back
        tree's, are dropped) and gets the new rows. Training: no cache; past_k / past_v [B, kv_heads, L, d]
        (or None) are the earlier rows' keys / values. visible [1, n, L + n] bool (None: causal). Returns
        (out [B, n, H], logits [B, n, V] or None, and the new rows' keys and values [B, kv_heads, n, d] when
        training, else None, None). `module`: which MTP module runs."""
        from transformers.cache_utils import Cache
        embeds = self.mtp.embed_tokens(tokens).to(g.dtype)                                   # [B, n, H]
        n = tokens.shape[1]
        if cache is None:
            rows = _PastRows(past_k, past_v)
            past = 0 if past_k is None else past_k.shape[2]
            if visible is None:
                visible = torch.ones(n, past + n, dtype=torch.bool, device=g.device).tril(past)[None]
            mask = visible[:, None]                                      # [1, 1, n, L + n] bool
        else:
            rows = cache
            cache.keep(start, None, start)
            if visible is None:
                visible = torch.ones(n, start + n, dtype=torch.bool, device=g.device).tril(start)[None]
            mask = torch.zeros(visible.shape, dtype=g.dtype, device=g.device).masked_fill(
                ~visible, torch.finfo(g.dtype).min)[:, None]
        # module k's attention writes to the cache's layer k (its layer index in MtpModel): every index is this one
        rotary = self.mtp.rotary_emb
        position_embeddings = rotary(embeds, position_ids=positions) if rotary is not None else None
        out = self.mtp.layers[module](embeds, g, position_embeddings=position_embeddings, attention_mask=mask,
                                 position_ids=positions, cache=Cache(layers=[rows] * (module + 1)))
        if self.mtp.use_shared_post_norm:
            out = self.mtp.shared_post_norm(out)
        logits = self.logits(out) if with_logits else None
        if cache is None:
            return out, logits, *rows.new
        return out, logits, None, None


class _PastRows(DynamicLayer):
    """A training forward's keys and values (heads/eagle_train.py unrolls the drafter and keeps them itself):
    the new rows attend over the given past ones and their own, and their keys and values are kept in `new`."""

    def __init__(self, past_k: torch.Tensor | None, past_v: torch.Tensor | None):
        super().__init__()
        self.past_k, self.past_v = past_k, past_v
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.new = (key_states, value_states)                                   # [B, kv_heads, n, d]
        if self.past_k is None:
            return key_states, value_states
        return torch.cat([self.past_k, key_states], dim=2), torch.cat([self.past_v, value_states], dim=2)
