"""Native multi-token-prediction (MTP) modules, as DeepSeek-V3/R1 and GLM-4.5 ship them.

The checkpoint holds them after the decoder's own layers, `model.layers.{L + i}.*` (enorm, hnorm,
eh_proj, shared_head, one decoder block) for i < num_nextn_predict_layers; Hugging Face's model drops
them at load. `load_mtp` reads them as the installed transformers' `MtpModel` reads them (its modules,
its weight conversions), stricter: a missing, extra or wrongly shaped tensor, or a shared head or
embedding that is not the target's, is refused with a message naming the tensor.

`MtpDrafter` runs module 0 with the call interface of specdec's EAGLE drafters (heads/eagle.py), so the
eagle strategy's chains, trees and sampling drive it: row t reads the target's feature at t (the last
hidden state, after the final norm: what Hugging Face's `use_mtp` feeds) and token t + 1, and its
output (after the module's post norm) is both the next row's feature and, through the shared head,
the guess for token t + 2.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
from torch import nn

from specdec.errors import ModelLoadError

CHECKPOINT_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
SHARED = {"shared_head.head.weight": "lm_head", "embed_tokens.weight": "input embedding"}


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


@torch.no_grad()
def load_mtp(target, folder: str | None = None):
    """The target's MTP modules (a transformers MtpModel sharing the target's embedding, head and rotary
    embedding), read from `folder` (default: the folder the target was loaded from)."""
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_layers import MtpModel
    from transformers.modeling_utils import LoadStateDictConfig
    from safetensors import safe_open
    folder = folder or target.config.name_or_path
    count = mtp_count(target)
    if not count:
        raise ModelLoadError(f"mtp: the target ({type(target).__name__}) announces no MTP modules (no "
                             f"num_nextn_predict_layers in its config): use a checkpoint that ships them "
                             f"(DeepSeek-V3/R1, GLM-4.5), or another strategy")
    if not folder or not os.path.isdir(folder):
        raise ModelLoadError(f"mtp: the MTP weights are read from the target's checkpoint folder, and {folder!r} is "
                             f"not one: load the target from a folder (target.path)")
    layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    tensors = checkpoint_tensors(folder)
    by_module = _modules_in(tensors, layers, count, folder)
    mtp = MtpModel(target, count).to(device=target.device, dtype=target.dtype)
    state_dict, handles = {}, {}
    for names in by_module.values():
        for name in names:
            file = tensors[name]
            if file not in handles:
                handles[file] = safe_open(os.path.join(folder, file), framework="pt")
            state_dict[name] = handles[file].get_slice(name)
            _check_shared(name, handles[file].get_tensor(name), target, layers, folder)
    info, _ = convert_and_load_state_dict_in_model(
        model=mtp, state_dict=state_dict,
        load_config=LoadStateDictConfig(weight_mapping=mtp.get_weight_conversions(target),
                                        device_map={"": target.device}, dtype=target.dtype))
    mtp._adjust_missing_and_unexpected_keys(info)
    _refuse(info, folder, layers)
    mtp.tie_with_main_model(target)
    return mtp.eval()


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


def _refuse(info, folder: str, layers: int) -> None:
    """Refuse what Hugging Face's loading left missing, unexpected or misshaped, naming the tensor."""
    if info.mismatched_keys:
        name, got, expected = sorted(info.mismatched_keys, key=str)[0]
        raise ModelLoadError(f"mtp: tensor {_checkpoint_name(name, layers)!r} in {folder!r} has shape {tuple(got)}, "
                             f"the target's MTP module needs {tuple(expected)}")
    if info.missing_keys:
        missing = sorted(info.missing_keys)
        raise ModelLoadError(f"mtp: {folder!r} lacks tensor {_checkpoint_name(missing[0], layers)!r} of an MTP module "
                             f"({len(missing)} missing: {', '.join(missing[:4])})")
    if info.unexpected_keys:
        unexpected = sorted(info.unexpected_keys)
        raise ModelLoadError(f"mtp: {folder!r} holds tensor {unexpected[0]!r}, which no MTP module of this target has "
                             f"({len(unexpected)} such)")


def _checkpoint_name(name: str, layers: int) -> str:
    """The checkpoint name of an MtpModel parameter name (layers.i.mtp_block.X -> model.layers.{L+i}.X)."""
    match = re.match(r"^layers\.(\d+)\.(?:mtp_block\.)?(.+)$", name)
    if not match:
        return name
    rest = match.group(2).replace("post_norm.", "shared_head.norm.")
    return f"model.layers.{layers + int(match.group(1))}.{rest}"


@dataclass(frozen=True)
class MtpLayout:
    """What the eagle strategy reads of a drafter's layout."""
    hidden_size: int
    modules: int
    feature_layers: tuple[int, ...] = (-1,)     # the target's last hidden state, after its final norm


class MtpDrafter(nn.Module):
    """MTP module 0 behind the EAGLE drafter's call interface (heads/eagle.py EagleDrafter.forward)."""

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
                cache=None, start: int = 0):
        """g [1, n, H] features, tokens [1, n] the token after each feature's position, positions [1, n];
        `cache` (a BufferedLayer) holds rows 0 .. start - 1 (rows after them, a rolled-back tree's, are
        dropped) and gets the new rows; visible [1, n, start + n] bool (None: causal). Returns (out
        [1, n, H], logits [1, n, V] or None, None, None)."""
        from transformers.cache_utils import Cache
        if cache is None:
            raise ValueError("MtpDrafter runs on a cache (inference only)")
        cache.keep(start, None, start)
        embeds = self.mtp.embed_tokens(tokens).to(g.dtype)                                   # [1, n, H]
        n = tokens.shape[1]
        if visible is None:
            visible = torch.ones(n, start + n, dtype=torch.bool, device=g.device).tril(start)[None]
        mask = torch.zeros(visible.shape, dtype=g.dtype, device=g.device).masked_fill(~visible, torch.finfo(g.dtype).min)
        rotary = self.mtp.rotary_emb
        position_embeddings = rotary(embeds, position_ids=positions) if rotary is not None else None
        out = self.mtp.layers[0](embeds, g, position_embeddings=position_embeddings, attention_mask=mask[:, None],
                                 position_ids=positions, cache=Cache(layers=[cache]))
        if self.mtp.use_shared_post_norm:
            out = self.mtp.shared_post_norm(out)
        return out, (self.logits(out) if with_logits else None), None, None
