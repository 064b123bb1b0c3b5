"""Loading Hugging Face models and tokenizers, with errors that say what to do."""
from __future__ import annotations

import os

import torch

from .errors import IncompatibleModelsError, ModelLoadError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device={device!r} asked for CUDA, but torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}); use device=cpu or install a CUDA build of torch")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return DTYPES[dtype]


def _check_model_dir(path: str, role: str, key: str) -> None:
    if not path:
        raise ModelLoadError(f"no {role} model given: set {key}=/path/to/a/huggingface/checkpoint")
    if not os.path.isdir(path):
        raise ModelLoadError(f"{role} model path {path!r} does not exist or is not a folder: give {key}= "
                             f"the folder of a Hugging Face checkpoint (config.json + weights); nothing is "
                             f"downloaded from a model hub")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelLoadError(f"{role} model folder {path!r} has no config.json: is it a Hugging Face checkpoint?")


def load_model(path: str, role: str, device: torch.device, dtype: torch.dtype, key: str | None = None):
    """`key`: the config key that names this folder, for hints (default "<role>.path")."""
    from transformers import AutoModelForCausalLM
    _check_model_dir(path, role, key or f"{role}.path")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised with the path and a hint
        raise ModelLoadError(f"could not load the {role} model from {path!r}: {exc}") from exc
    return model.to(device).eval()


def load_tokenizer(path: str, role: str = "target", key: str | None = None):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"could not load a tokenizer from {path!r} ({role}): {exc}. "
                             f"Put the tokenizer files in the model folder or set {key or role + '.tokenizer'}=PATH") from exc


def output_vocab_size(model) -> int:
    """Width of the model's logits."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return head.weight.shape[0]
    return model.config.vocab_size


def context_length(model, tokenizer=None) -> int | None:
    """The longest sequence the model takes (positions), when it says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_vocab: int, draft_vocab: int) -> None:
    """A draft must speak the target's token ids: same vocabulary (when both tokenizers are
    known), and logits wide enough to cover every token the tokenizer has."""
    if target_tokenizer is not None and draft_tokenizer is not None:
        target_v, draft_v = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if target_v != draft_v:
            diff = sorted(set(target_v.items()) ^ set(draft_v.items()))[:3]
            raise IncompatibleModelsError(
                f"the draft's tokenizer differs from the target's ({len(draft_v)} vs {len(target_v)} tokens; "
                f"first differences: {diff}): speculative decoding needs the same token ids. "
                f"Use a draft trained with the target's tokenizer")
    n_tokens = len(target_tokenizer) if target_tokenizer is not None else target_vocab
    if draft_vocab < n_tokens:
        raise IncompatibleModelsError(
            f"the draft's logits cover {draft_vocab} tokens but the target's tokenizer has {n_tokens}: "
            f"use a draft trained with the target's tokenizer")
