"""Training checkpoints of every trainer (Medusa heads, the EAGLE drafter, a distilled draft model, a target
fine-tuned for early exit, the default family's target pretrained from scratch):
one safetensors file that a resumed run reads back bit-exactly, and nothing in it is a pickle, so
resuming from a folder someone hands you runs no code of theirs.

    <output_dir>/checkpoint.safetensors (heads), eagle_checkpoint.safetensors, draft_checkpoint.safetensors,
                 early_exit_checkpoint.safetensors, pretrain_checkpoint.safetensors
      tensors   module.<name>          the trained module's state_dict
                optimizer.<i>.<key>    the optimizer's tensors of parameter i (AdamW: step, exp_avg, exp_avg_sq)
                rng.window             the window sampler's torch.Generator state
      metadata  format = "specdec-training-checkpoint"
                checkpoint = JSON {"version": 1, "kind": "medusa" | "eagle" | "draft" | "early_exit" | "pretrain",
                    "target": {path, architecture, hidden_size, vocab_size, fingerprint},
                    "layout": the module's layout (or null),
                    "optimizer": {"param_groups": [...], "state": {i: {non-tensor entries}}},
                    "progress": {step, history, losses, elapsed_s, ...}}

The learning rate is a function of the step (no scheduler object to save), and every other random
draw of a step is keyed by (seed, step), so these are all a run needs to go on as if never stopped.
The file is written atomically (specdec.atomic). Loading refuses, with what to do: a file that is not
such a checkpoint (the pickles of earlier versions are recognised and never unpickled), a checkpoint
of another trainer (kind) or of another target, and a module of another layout or shape.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specdec.atomic import atomic_write
from specdec.errors import ConfigError, ModelLoadError

from .io import fingerprints_match, target_identity

FORMAT = "specdec-training-checkpoint"
VERSION = 1
KINDS = {"medusa": "Medusa heads", "eagle": "an EAGLE drafter", "draft": "a draft model",   # what each trains
         "early_exit": "a target fine-tuned for early exit", "pretrain": "a language model pretrained from scratch"}
START_OVER = "use another output_dir, or delete {path} to start over"


def checkpoint_target(target, path: str) -> dict:
    """The identity of the target a run trains for, as its checkpoints record it: the folder it was
    loaded from (for messages) and io.target_identity (architecture, sizes, weight fingerprint)."""
    return {"path": os.path.abspath(path), **target_identity(target)}


# ---------------------------------------------------------------------- saving
def save_checkpoint(path: str, kind: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    generator: torch.Generator, target: dict, layout: dict | None = None, **progress) -> None:
    """Write the checkpoint of a run training `module` (`kind` of KINDS) for `target`
    (checkpoint_target) atomically at `path`; `progress` (step, history, ...) must be JSON."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}: one of {sorted(KINDS)}")
    optimizer_tensors, optimizer_rest = _split_optimizer_state(optimizer.state_dict())
    tensors = {**{f"module.{name}": value for name, value in module.state_dict().items()},
               **optimizer_tensors, "rng.window": generator.get_state()}
    info = {"version": VERSION, "kind": kind, "target": target, "layout": layout,
            "optimizer": optimizer_rest, "progress": progress}
    metadata = {"format": FORMAT, "checkpoint": json.dumps(info)}
    tensors = _separate_storage(tensors)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _split_optimizer_state(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer's state_dict -> (its tensors by "optimizer.<i>.<key>", the rest as JSON values)."""
    tensors, plain = {}, {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{key}"] = value
            else:
                plain.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "state": plain}


def _separate_storage(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors, each with a storage of its own (safetensors refuses shared
    ones, such as a draft's tied embedding and lm_head): a tensor whose storage was seen is copied."""
    seen, out = set(), {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


# ---------------------------------------------------------------------- reading
def read_checkpoint(path: str) -> dict:
    """A checkpoint's contents, checked to be one and never unpickled: {"kind", "target", "layout",
    "module": state_dict, "optimizer": state_dict, "window_rng": ByteTensor, **progress}."""
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise _not_a_checkpoint(path, exc) from None
    if metadata.get("format") != FORMAT:
        raise ModelLoadError(f"{path} is a safetensors file but not a specdec training checkpoint (its format is "
                             f"{metadata.get('format')!r}, not {FORMAT!r}): {START_OVER.format(path=path)}")
    def corrupt(exc: Exception) -> ModelLoadError:
        return ModelLoadError(f"checkpoint {path} is corrupt (its JSON or tensors are incomplete: {exc!r}): "
                              f"{START_OVER.format(path=path)}")
    try:
        info = json.loads(metadata["checkpoint"])
        version = info["version"]
    except (KeyError, TypeError, ValueError) as exc:
        raise corrupt(exc) from None
    if version != VERSION:
        raise ModelLoadError(f"checkpoint {path} has version {version}; this specdec reads version {VERSION}: "
                             f"resume it with the specdec that wrote it, or {START_OVER.format(path=path)}")
    try:
        module = {name[len("module."):]: t for name, t in tensors.items() if name.startswith("module.")}
        return {"kind": info["kind"], "target": info["target"], "layout": info["layout"], "module": module,
                "optimizer": _join_optimizer_state(tensors, info["optimizer"]), "window_rng": tensors["rng.window"],
                **info["progress"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise corrupt(exc) from None


def _join_optimizer_state(tensors: dict[str, torch.Tensor], rest: dict) -> dict:
    """The inverse of _split_optimizer_state: an optimizer's state_dict (JSON lists that were tuples,
    such as AdamW's betas, are tuples again)."""
    state: dict[int, dict] = {}
    for name, tensor in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = tensor
    for index, entries in rest["state"].items():
        state.setdefault(int(index), {}).update(entries)
    groups = [{key: (tuple(value) if isinstance(value, list) and key != "params" else value)
               for key, value in group.items()} for group in rest["param_groups"]]
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def _not_a_checkpoint(path: str, exc: Exception) -> ModelLoadError:
    """The error for a file safetensors cannot read: a pickle (said so, it is not loaded) or corrupt."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"PK" or head[:1] == b"\x80":     # torch.save's zip archive, or a bare pickle
        return ModelLoadError(pickle_refusal(path))
    return ModelLoadError(f"checkpoint {path} is corrupt or truncated ({exc}): {START_OVER.format(path=path)}")


def pickle_refusal(path: str) -> str:
    return (f"{path} is a pickled training checkpoint (torch.save, the format of specdec before safetensors "
            f"checkpoints); it was not loaded, because unpickling a file can run any code it holds. "
            f"Resuming from it is not possible: {START_OVER.format(path=path)} (a checkpoint you made yourself "
            f"with an earlier specdec: finish that run with that version)")


# ---------------------------------------------------------------------- resuming
def find_checkpoint(path: str, legacy: str | None = None) -> bool:
    """Whether there is a checkpoint at `path` to resume from. A file at `legacy` (where earlier
    versions kept a pickled checkpoint) is refused, unread: resuming must not skip it silently."""
    if legacy is not None and os.path.lexists(legacy):
        raise ModelLoadError(pickle_refusal(legacy))
    return os.path.isfile(path)


def load_checkpoint(path: str, kind: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    generator: torch.Generator, target: dict, layout: dict | None = None) -> dict:
    """Restore what save_checkpoint wrote into module / optimizer / generator, after checking that it
    belongs to this run (same kind, same target, same layout and shapes); returns its progress
    entries (step, history, ...)."""
    saved = read_checkpoint(path)
    if saved["kind"] != kind:
        raise ConfigError(f"{path} is a checkpoint of a run training {KINDS.get(saved['kind'], saved['kind'])} "
                          f"(kind {saved['kind']!r}), but this run trains {KINDS[kind]} (kind {kind!r}): "
                          f"{START_OVER.format(path=path)}")
    if not same_target(saved["target"], target):
        raise ConfigError(f"{path} is a checkpoint for the target {describe_target(saved['target'])}, but this "
                          f"run's target is {describe_target(target)}, whose weights differ: "
                          f"{START_OVER.format(path=path)}")
    if layout is not None and saved["layout"] != json.loads(json.dumps(layout)):
        raise ConfigError(f"{path} holds {KINDS[kind]} of layout {saved['layout']}, but this run asks for "
                          f"{layout}: {START_OVER.format(path=path)}")
    _check_shapes(path, kind, saved["module"], module.state_dict())
    module.load_state_dict(saved["module"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["window_rng"])
    return {key: value for key, value in saved.items()
            if key not in ("kind", "target", "layout", "module", "optimizer", "window_rng")}


def same_target(saved: dict, current: dict) -> bool:
    return (saved.get("hidden_size") == current["hidden_size"] and saved.get("vocab_size") == current["vocab_size"]
            and fingerprints_match(saved.get("fingerprint", []), current["fingerprint"]))


def describe_target(target: dict) -> str:
    return (f"{target.get('path', '(unknown folder)')} ({target.get('architecture')}, hidden size "
            f"{target.get('hidden_size')}, vocabulary {target.get('vocab_size')})")


def _check_shapes(path: str, kind: str, saved: dict, current: dict) -> None:
    differences = [f"{name} {list(saved[name].shape)} saved, {list(current[name].shape)} here"
                   for name in current if name in saved and saved[name].shape != current[name].shape]
    differences += [f"{name} missing" for name in current if name not in saved]
    differences += [f"{name} unexpected" for name in saved if name not in current]
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        raise ConfigError(f"{path} holds {KINDS[kind]} of another shape than this run's ({shown}): "
                          f"{START_OVER.format(path=path)}")
