"""LayerSkip's training recipe (Elhoushi et al. 2024), the parts that are arithmetic: which exits get a
loss on which step (the curriculum), how much each exit's loss weighs, how likely each layer is to be
dropped, and the forward hooks that drop layers per row and keep each layer's output for its exit.

Exits are counted as `early_exit.exit_layer` counts them: exit E reads the output of the first E decoder
layers (1 .. L; E = L is the model's own output). Layer l (0 .. L - 1) is the (l + 1)-th layer.

    exits_at(step, L, "rotational", rotation=2, steps=300)   -> [1, 3, 5, 7, 8] at even steps, [2, 4, 6, 8] at odd
    exit_weights([1, 3, 8], L, "sum_l", e_scale=1.0)         -> {1: 1/43, 3: 6/43, 8: 36/43}
    dropout_rates(L, p_max=0.1, "exp")                        -> [0, ..., 0.1]: 0 at layer 0, p_max at layer L - 1
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from specdec.errors import IncompatibleModelsError

CURRICULA = ("rotational", "gradual", "none")
SCALE_TYPES = ("sum_l", "l", "one")
DROPOUT_SCALES = ("exp", "linear")
FINAL_NORM_NAMES = ("norm", "final_layer_norm", "ln_f", "final_layernorm", "final_norm")


# ---------------------------------------------------------------------- the curriculum
def exits_at(step: int, layers: int, curriculum: str, rotation: int = 1, steps: int = 1) -> list[int]:
    """The exits that get a loss at `step` (sorted; the last, L, always):
    rotational (the paper's C_rot,R): every `rotation`-th exit, the set moving one exit deeper each step,
      so each exit gets a loss once every `rotation` steps;
    gradual (C_grad): exits switched on from the deepest down, exit E from step (L - E) / (L - 1) *
      steps / 2 on, so all of them by half the run;
    none: every exit, every step."""
    if curriculum == "none":
        chosen = range(1, layers)
    elif curriculum == "rotational":
        chosen = [e for e in range(1, layers) if (e - 1 - step) % rotation == 0]
    elif curriculum == "gradual":
        chosen = [e for e in range(1, layers) if 2 * step * (layers - 1) >= (layers - e) * steps]
    else:
        raise ValueError(f"unknown early-exit curriculum {curriculum!r}: one of {CURRICULA}")
    return [*chosen, layers]


def exit_weights(exits: list[int], layers: int, scale_type: str, e_scale: float) -> dict[int, float]:
    """{exit: weight of its cross-entropy}, summing to 1 over `exits`: sum_l weighs exit E by
    1 + 2 + ... + E (deeper exits more, as the paper's e(l)), l by E, one alike; every exit but the
    last is further multiplied by e_scale (the paper's scale of the early-exit losses)."""
    if scale_type not in SCALE_TYPES:
        raise ValueError(f"unknown early-exit loss scale {scale_type!r}: one of {SCALE_TYPES}")
    raw = {}
    for e in exits:
        base = {"sum_l": e * (e + 1) / 2, "l": float(e), "one": 1.0}[scale_type]
        raw[e] = base * (e_scale if e < layers else 1.0)
    total = sum(raw.values())
    return {e: w / total for e, w in raw.items()}


# ---------------------------------------------------------------------- layer dropout
def dropout_rates(layers: int, p_max: float, scale: str) -> list[float]:
    """The drop probability of each layer 0 .. L - 1, rising from 0 at layer 0 to p_max at the last:
    exp is the paper's D(l) = e^(l ln 2 / (L - 1)) - 1, linear is l / (L - 1)."""
    if scale not in DROPOUT_SCALES:
        raise ValueError(f"unknown layer-dropout scale {scale!r}: one of {DROPOUT_SCALES}")
    if layers == 1:
        return [0.0]
    shape = (lambda l: math.exp(l * math.log(2) / (layers - 1)) - 1) if scale == "exp" else \
        (lambda l: l / (layers - 1))
    return [p_max * shape(l) for l in range(layers)]


def keep_mask(rates: list[float], rows: int, generator: torch.Generator) -> torch.Tensor:
    """[L, rows] bool: whether layer l runs for row b this step (dropped with probability rates[l],
    for each row apart, as the paper drops layers per sample)."""
    draws = torch.rand(len(rates), rows, generator=generator)                  # [L, rows]
    return draws >= torch.tensor(rates, dtype=draws.dtype).unsqueeze(1)


# ---------------------------------------------------------------------- the model's pieces
def final_norm(model, layers_path: str) -> nn.Module:
    """The final norm that the decoder applies after its layers: a child of the module that holds the
    layer list (model.norm of Llama, transformer.ln_f of GPT-2, decoder.final_layer_norm of OPT)."""
    parent = model.get_submodule(layers_path.rpartition(".")[0])
    for name in FINAL_NORM_NAMES:
        module = getattr(parent, name, None)
        if isinstance(module, nn.Module):
            return module
    raise IncompatibleModelsError(
        f"specdec train early-exit: found no final norm beside {layers_path} in {type(model).__name__} (looked "
        f"for {', '.join(FINAL_NORM_NAMES)}), so an early exit's hidden state cannot be normed as the last "
        f"layer's is; this architecture is not supported by the early-exit trainer")


@contextlib.contextmanager
def layer_hooks(layers: nn.ModuleList, keep: torch.Tensor | None, outputs: dict[int, torch.Tensor]):
    """While open, each forward of the model writes outputs[l] = layer l's output hidden states [b, T, H];
    with `keep` [L, b], a row whose layer l is dropped takes the layer's input instead (the residual
    stream passes it by: it still runs on the whole batch, so dropping saves no time here)."""
    def hook(index: int):
        def after(module, args, kwargs, output):
            hidden = output[0] if isinstance(output, tuple) else output                # [b, T, H]
            if keep is not None and not bool(keep[index].all()):
                given = args[0] if args else kwargs["hidden_states"]                  # [b, T, H]
                runs = keep[index].to(hidden.device).view(-1, 1, 1)                   # [b, 1, 1]
                hidden = torch.where(runs, hidden, given.to(hidden.dtype))
            outputs[index] = hidden
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
        return after
    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()
