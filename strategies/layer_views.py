"""Views of a target's decoder layers: a Hugging Face model object that runs a list of the target's
own layer modules or stand-ins for them (no weight copied, the target never changed): early_exit's
draft (exit_view), the two parts of its KV reuse (part_view, strategies/exit_split.py) and
layer_skip's draft (view_with_layers over layers with silenced sublayers)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.models import recurrent_layer_kinds, shallow_module


def num_layers(model) -> int:
    """L: the decoder layers of `model` (its text config's num_hidden_layers)."""
    return int(model.config.get_text_config(decoder=True).num_hidden_layers)


def decoder_layers(model, strategy: str = "early_exit") -> str:
    """The dotted path from `model` to the nn.ModuleList of its decoder's layers: the one ModuleList of
    exactly L modules in the model (`model.layers` of Llama, Qwen2, Mistral, GPT-NeoX; `transformer.h`
    of GPT-2; `model.decoder.layers` of OPT). Anything else is refused: an architecture whose layers
    cannot be run apart."""
    count = num_layers(model)
    recurrent = recurrent_layer_kinds(model)
    if recurrent:
        # a view's forward would move the recurrent state of the layers it runs, which the verifier keeps
        # for the target's own forwards (specdec.verifier: its rollback), and whose draft-time updates
        # nothing could undo
        raise IncompatibleModelsError(
            f"{strategy}: the target ({type(model).__name__}) has {recurrent[0]!r} "
            f"layers, whose recurrent state a draft through its own layers would move: its layers cannot be run "
            f"apart; use a strategy that drafts chains without them (prompt_lookup, draft_model, mtp)")
    found = [name for name, module in model.named_modules() if isinstance(module, nn.ModuleList) and len(module) == count]
    if len(found) != 1:
        raise IncompatibleModelsError(
            f"{strategy}: the target ({type(model).__name__}, model_type {model.config.model_type!r}) has "
            f"{'no' if not found else len(found)} lists of exactly its {count} decoder layers "
            f"({', '.join(found) or 'none found'}), not one, so its layers cannot be run apart; "
            f"use another strategy (draft_model, eagle)")
    return found[0]


def _part_config(config, layers: slice):
    """A copy of the target's config for a decoder of its layers `layers` (a slice of 0 .. L)."""
    config = copy.deepcopy(config)
    text = config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        text.layer_types = list(layer_types)[layers]
    text.num_hidden_layers = len(range(int(text.num_hidden_layers))[layers])
    return config


def exit_view(target, exit_layer: int) -> nn.Module:
    """The target's first `exit_layer` decoder layers, then its final norm and lm_head, as a causal LM
    of its own (a Hugging Face model object): the same modules, so the same weights, nothing copied.
    Refused (ConfigError) outside 1 .. L - 1, and (IncompatibleModelsError) where the decoder's layers
    cannot be run apart: then a probe forward of the view must run exactly its first `exit_layer` layers."""
    count = num_layers(target)
    if not 1 <= exit_layer <= count - 1:
        raise ConfigError(f"early_exit.exit_layer must be in 1 .. {count - 1} (the target has {count} decoder "
                          f"layers; E = {count} would draft with the whole target), got {exit_layer}")
    view = part_view(target, slice(0, exit_layer))
    _check_runs_its_layers(view, list(target.get_submodule(decoder_layers(target))), exit_layer)
    return view


def part_view(target, layers: slice) -> nn.Module:
    """The target as a causal LM of its own whose decoder runs only its layer modules `layers` (a slice
    of 0 .. L), then its final norm and lm_head; each layer keeps its own index into the KV cache (its
    attention module's layer_idx)."""
    all_layers = list(target.get_submodule(decoder_layers(target)))
    return view_with_layers(target, all_layers[layers], _part_config(target.config, layers)).eval()


def view_with_layers(target, layers: list[nn.Module], config=None) -> nn.Module:
    """A shallow copy of `target` whose decoder runs `layers` (modules, the target's own or stand-ins for
    them) in place of its own list: the target and every module on the way to its layer list are
    copied (shallow_module), the rest shared. `config`: a config for the modules on that way (their
    layer count), or None to keep the target's. The target is never changed."""
    path = decoder_layers(target).split(".")
    configs = {} if config is None else {
        id(target.config): config,
        id(target.config.get_text_config(decoder=True)): config.get_text_config(decoder=True)}
    view = shallow_module(target)
    on_path = [view]                       # the view and every module on the way to the layers: copies
    for name in path[:-1]:
        on_path.append(shallow_module(on_path[-1]._modules[name]))
        on_path[-2]._modules[name] = on_path[-1]
    on_path[-1]._modules[path[-1]] = nn.ModuleList(layers)
    for module in on_path:                 # they read the new count; the layers themselves keep the target's config
        if id(getattr(module, "config", None)) in configs:
            module.config = configs[id(module.config)]
    return view


def probe_forward(view, what: str, tokens: int, **kwargs) -> None:
    """One forward of `view` over `tokens` token ids (0), as a check that it runs; whatever it raises is
    re-raised as an IncompatibleModelsError that starts with `what` (what the architecture lacks)."""
    try:
        ids = torch.zeros(1, tokens, dtype=torch.long, device=next(view.parameters()).device)
        view(input_ids=ids, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised as what the architecture lacks
        raise IncompatibleModelsError(f"{what} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                                      f"use another strategy") from exc


@torch.inference_mode()
def _check_runs_its_layers(view, layers: list[nn.Module], exit_layer: int) -> None:
    """One forward of the view over a token: the first `exit_layer` layers run once each, the others
    never (a decoder that indexes its layers by a count of its own is refused here)."""
    ran: list[int] = []
    handles = [layer.register_forward_pre_hook(lambda module, args, i=i: ran.append(i))
               for i, layer in enumerate(layers)]
    what = f"early_exit: the target ({type(view).__name__}) cannot run its first {exit_layer} layers apart"
    try:
        probe_forward(view, what, 1, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if ran != list(range(exit_layer)):
        raise IncompatibleModelsError(f"{what}: a forward of the view ran layers {ran}, not 0 .. {exit_layer - 1}; "
                                      f"use another strategy")
