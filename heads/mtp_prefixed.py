"""The `mtp.*` layout of MTP modules: Qwen3-Next's and the Qwen3.5 family's.

Their checkpoints keep one MTP module apart from the decoder, announced by `mtp_num_hidden_layers` in the
config, as vLLM's `qwen3_next_mtp` / `qwen3_5_mtp` read it:

    mtp.pre_fc_norm_embedding.weight   the norm of the next token's embedding
    mtp.pre_fc_norm_hidden.weight      the norm of the target's hidden state
    mtp.fc.weight                      [H, 2H] over cat([normed embedding, normed hidden])
    mtp.layers.0.*                     one decoder layer with full attention (the model's own MLP: MoE or dense)
    mtp.norm.weight                    the norm after it: the module's output, fed to the shared lm_head

That is DeepSeek's module under other names (enorm, hnorm, eh_proj, mtp_block, post_norm: transformers'
`MtpLayer`, the same projection order), so it is read into the same `MtpModel` and drafts through the
same MtpDrafter. Its block is built with full attention, whatever the target's layer 0 is (the target's
config.layer_types say which of its own layers are linear attention), and its norms are the decoder's
own norm class. Hugging Face's model drops `mtp.*` at load, and its save_pretrained writes none back.
"""
from __future__ import annotations

import os

from specdec.errors import ModelLoadError

PREFIX = "mtp."
# checkpoint name prefix -> transformers' MtpModel parameter prefix (module 0: the only one specdec reads)
NAMES = (("mtp.pre_fc_norm_embedding.", "layers.0.enorm."), ("mtp.pre_fc_norm_hidden.", "layers.0.hnorm."),
         ("mtp.fc.", "layers.0.eh_proj."), ("mtp.layers.0.", "layers.0.mtp_block."),
         ("mtp.norm.", "layers.0.post_norm."))
BLOCK_TYPE = "full_attention"


def announced(target) -> int:
    """The mtp.* layers the target's config announces (mtp_num_hidden_layers), 0 if none."""
    return int(getattr(target.config.get_text_config(decoder=True), "mtp_num_hidden_layers", None) or 0)


def prefixed_tensors(tensors: dict[str, str]) -> list[str]:
    return sorted(name for name in tensors if name.startswith(PREFIX))


def model_names(target, tensors: dict[str, str], folder: str, hint: str) -> dict[str, str]:
    """{MtpModel parameter name: checkpoint name} of the checkpoint's mtp.* tensors, after checking that the
    config and the tensors agree on one module and that the target can build its block."""
    count, names = announced(target), prefixed_tensors(tensors)
    if not count:
        raise ModelLoadError(f"mtp: {folder!r} holds tensor {names[0]!r} ({len(names)} mtp.* tensors), and the "
                             f"target's config announces no MTP layer (no mtp_num_hidden_layers): the checkpoint "
                             f"and its config disagree; add mtp_num_hidden_layers: 1 to its config.json if they are "
                             f"its modules")
    if not names:
        raise ModelLoadError(f"mtp: the target's config announces {count} MTP layer(s) (mtp_num_hidden_layers) and "
                             f"{folder!r} holds no mtp.* tensor: a checkpoint saved without its MTP weights "
                             f"(Hugging Face's save_pretrained drops them); load the original checkpoint")
    if count != 1:
        raise ModelLoadError(f"mtp: the target's config announces mtp_num_hidden_layers={count}; specdec reads the "
                             f"mtp.* layout with one layer (as Qwen3-Next and Qwen3.5 ship it)")
    layer_types = getattr(target.config.get_text_config(decoder=True), "layer_types", None)
    if not layer_types or BLOCK_TYPE not in layer_types:
        raise ModelLoadError(f"mtp: the mtp.* layout's block is a full-attention decoder layer, and this target "
                             f"({type(target).__name__}) names none in config.layer_types: draft with another "
                             f"strategy or train modules for it with {hint}")
    renamed = {}
    for name in names:
        match = next(((ours, theirs) for ours, theirs in NAMES if name.startswith(ours)), None)
        if match is None:
            raise ModelLoadError(f"mtp: {folder!r} holds tensor {name!r}, which the mtp.* layout's one module has "
                                 f"not (it has {', '.join(ours + '*' for ours, _ in NAMES)})")
        renamed[match[1] + name[len(match[0]):]] = name
    return renamed


def checkpoint_name(name: str) -> str:
    """The checkpoint name of an MtpModel parameter name (layers.0.mtp_block.X -> mtp.layers.0.X)."""
    for ours, theirs in NAMES:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def find_layout(target, folder: str | None, tensors_of) -> dict[str, str] | None:
    """The checkpoint's tensors ({name: file}, from tensors_of(folder)) where the target's config or its
    checkpoint folder speaks of mtp.* modules, read once for the loading to use ({} when the config announces
    them and `folder` is no folder); None where neither does."""
    found = None
    if folder and os.path.isdir(folder):
        try:
            found = tensors_of(folder)
        except ModelLoadError:                   # no safetensors file: the config alone can speak of them
            if announced(target):
                raise
    if announced(target):
        return found or {}
    return found if found and prefixed_tensors(found) else None
