"""Checks of generate()/stream()'s arguments: a value of the wrong type or out of range becomes an
error that names the argument, the value and what is valid (never a silent rounding or a raw
TypeError deep in torch). Integers may be Python, numpy or 0-d torch integers; bools are not
integers here. The arguments and their defaults are listed once, in config.GenerationDefaults."""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Mapping

import numpy as np
import torch

from .errors import InputError

SAMPLERS = ("rejection", "coupled")       # generation.sampler: how sampled tokens are drawn (specdec.coupled)

# Below this the warped logits (logits / temperature) overflow fp32 for ordinary logits, and
# sampling is greedy in all but name; temperature=0 is the greedy path.
MIN_TEMPERATURE = 1e-4
SEED_LIMIT = 2 ** 64


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def as_int(value: Any) -> int | None:
    """`value` as a Python int when it is an integer (not a bool), else None."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_int(value: Any, name: str, minimum: int, note: str = "", error=InputError) -> int:
    number = as_int(value)
    if number is None or number < minimum:
        raise error(f"{name} must be an integer >= {minimum}{note}, got "
                    f"{_shown(value) if number is None else number}")
    return number


def check_real(value: Any, name: str, error=InputError) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {_shown(value)}")
    return float(value)


def check_temperature(value: Any, name: str = "temperature", error=InputError) -> float:
    temperature = check_real(value, name, error)
    if temperature < 0:
        raise error(f"{name} must be >= 0 (0 = greedy), got {value!r}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise error(f"{name} must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {value!r}: smaller "
                    f"temperatures overflow fp32 logits (logits / temperature) and sample the top token anyway; "
                    f"use temperature=0 for greedy decoding")
    return temperature


def check_max_new_tokens(value: Any, name: str = "max_new_tokens", error=InputError) -> int:
    return check_int(value, name, 1, "", error)


def check_top_k(value: Any, name: str = "top_k", error=InputError) -> int:
    return check_int(value, name, 0, " (0 = off)", error)


def check_top_p(value: Any, name: str = "top_p", error=InputError) -> float:
    top_p = check_real(value, name, error)
    if not 0 < top_p <= 1:
        raise error(f"{name} must be in (0, 1] (1 = off), got {value!r}")
    return top_p


def check_seed(value: Any, name: str = "seed", error=InputError) -> int | None:
    if value is None:
        return None
    seed = as_int(value)
    if seed is None or not 0 <= seed < SEED_LIMIT:
        raise error(f"{name} must be None (a fresh random seed) or an integer in [0, 2**64), got {_shown(value)}")
    return seed


def check_text(text: str, name: str, error=InputError) -> str:
    """`text` when it is valid Unicode (encodable as UTF-8): a lone surrogate such as "\\ud800" (what
    decoding bytes with errors="surrogateescape", or a bad JSON escape, leaves behind) is no character
    a tokenizer can encode, and tokenizers meet it with a raw TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{name} is not valid Unicode text: it holds a lone surrogate {text[exc.start]!r} at character "
                    f"{exc.start}, which no tokenizer can encode; remove it, or re-decode the bytes it came from "
                    f"with errors='replace'") from None
    return text


def check_stop(value: Any, name: str = "stop", error=InputError) -> tuple[str, ...]:
    """None, a string or a list of strings -> a tuple of non-empty stop strings."""
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    try:
        strings = list(strings)
    except TypeError:
        strings = None
    if strings is None or not all(isinstance(s, str) for s in strings):
        raise error(f"{name} must be a string or a list of strings, got {_shown(value)}")
    if any(s == "" for s in strings):
        raise error(f"{name} holds an empty string, which every text contains (generation would stop after "
                    f"one token): give non-empty stop strings, or none at all")
    if isinstance(value, str):
        return (check_text(value, name, error),)
    return tuple(check_text(s, f"{name}[{i}]", error) for i, s in enumerate(strings))


def check_token_ids(value: Any, name: str, error=InputError) -> list[int]:
    """A list / tuple / 1-d array or tensor of integer ids -> a list of ints (bools refused)."""
    if isinstance(value, (torch.Tensor,)) or hasattr(value, "__array__"):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise error(f"{name} must be a list of integer token ids, got {_shown(value)}")
    ids = []
    for i, item in enumerate(value):
        token = as_int(item)
        if token is None:
            raise error(f"{name}[{i}] is {_shown(item)}: token ids must be integers")
        ids.append(token)
    return ids


def check_flag(value: Any, name: str, error=InputError) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise error(f"{name} must be True or False, got {_shown(value)}")


def check_sampler(value: Any, name: str, error=InputError) -> str:
    if not isinstance(value, str) or value not in SAMPLERS:
        raise error(f"{name} must be one of {', '.join(SAMPLERS)} (rejection: lossless rejection sampling; "
                    f"coupled: Gumbel-max noise keyed by (seed, position), the same text for every strategy), "
                    f"got {_shown(value)}")
    return value


# one check per field of config.GenerationDefaults (the config-settable arguments)
CHECKS = {"max_new_tokens": check_max_new_tokens, "temperature": check_temperature, "top_k": check_top_k, "top_p": check_top_p,
          "seed": check_seed, "stop": check_stop, "sampler": check_sampler}


def check_generation_args(values: Mapping[str, Any], prefix: str = "", error=InputError) -> dict[str, Any]:
    """The config-settable arguments (config.GenerationDefaults' fields), checked and normalised;
    `prefix` names them as config keys (e.g. "generation.") in messages."""
    return {name: CHECKS[name](value, prefix + name, error) if name in CHECKS else value
            for name, value in values.items()}
