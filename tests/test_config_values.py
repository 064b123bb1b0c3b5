"""Every numeric key of a generation config is range-checked at load: a table over all keys
(zero, negative, NaN, infinity, a wrong type) checked against the limits each field declares."""
from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from specdec.config import load_spec_config, spec_config_class
from specdec.errors import ConfigError


def numeric_keys(schema_cls, where: str = ""):
    """(dotted key, base type, declared limits) of every int / float field, sections included."""
    hints = typing.get_type_hints(schema_cls)
    for f in dataclasses.fields(schema_cls):
        hint = hints[f.name]
        key = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(hint):
            yield from numeric_keys(hint, key)
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
        if base in (int, float):
            yield key, base, f.metadata.get("limits", {})


KEYS = list(numeric_keys(spec_config_class()))


def allowed(value, limits) -> bool:
    """Whether `value` is within a field's declared limits (the specification the loader must meet)."""
    if not math.isfinite(value):
        return False
    return (value >= limits.get("min", -math.inf) and value > limits.get("above", -math.inf)
            and value <= limits.get("max", math.inf))


def test_the_table_covers_every_section():
    sections = {key.split(".")[0] for key, _, _ in KEYS}
    assert {"draft", "prompt_lookup", "medusa", "eagle", "auto", "generation"} <= sections


@pytest.mark.parametrize("key, base, limits", KEYS, ids=[k for k, _, _ in KEYS])
def test_every_numeric_key_declares_its_range(key, base, limits):
    assert {"min", "above", "choices"} & limits.keys(), f"{key} declares no lower bound: give it setting(..., min=)"


@pytest.mark.parametrize("key, base, limits", KEYS, ids=[k for k, _, _ in KEYS])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "abc", [1]])
def test_bad_numbers_are_refused_with_the_key_named(key, base, limits, value):
    in_range = isinstance(value, (int, float)) and allowed(value, limits) \
        and (base is float or isinstance(value, int))
    if in_range:
        cfg = load_spec_config("autoregressive", {key: value})
        section, _, name = key.rpartition(".")
        assert (cfg[section] if section else cfg)[name] == value
        return
    with pytest.raises(ConfigError) as info:
        load_spec_config("autoregressive", {key: value})
    assert key in str(info.value)


def test_a_list_entry_below_its_minimum_is_refused():
    with pytest.raises(ConfigError, match=r"'draft.branching'.*every entry must be >= 1"):
        load_spec_config("draft_model", {"draft.branching": [2, 0]})


@pytest.mark.parametrize("key, value", [("eagle.dtype", "float8"), ("medusa.tree", "bushy"),
                                        ("auto.drafter", "beam")])
def test_closed_choices_are_listed(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}'.*use one of"):
        load_spec_config("autoregressive", {key: value})
