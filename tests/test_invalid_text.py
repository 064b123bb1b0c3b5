"""A prompt or stop string holding a lone surrogate (no valid Unicode) is an InputError that says
so, names the position and what to do - not a raw TypeError from the tokenizer - and the
Speculator stays usable."""
from __future__ import annotations

from functools import lru_cache

import pytest

from conftest import char_tokenizer, tiny_model
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.errors import ConfigError, InputError
from specdec.strategies.autoregressive import Autoregressive


@lru_cache(maxsize=None)
def speculator() -> Speculator:
    return Speculator(tiny_model("llama", seed=0), char_tokenizer(), Autoregressive())


def test_the_tokenizer_alone_raises_a_raw_type_error():
    """Why the check exists: what the user met before."""
    with pytest.raises(TypeError):
        char_tokenizer()("ab\ud800")


@pytest.mark.parametrize("call", ["generate", "stream"])
@pytest.mark.parametrize("prompt", ["ab\ud800", ["ab\ud800"]])
def test_a_prompt_with_a_lone_surrogate(call, prompt):
    sd = speculator()
    with pytest.raises(InputError) as info:
        getattr(sd, call)(prompt, max_new_tokens=2)
    message = str(info.value)
    assert "the prompt is not valid Unicode text" in message
    assert "'\\ud800' at character 2" in message
    assert "remove it" in message and "errors='replace'" in message
    assert len(sd.generate("ab", max_new_tokens=2).token_ids) == 2        # still usable


@pytest.mark.parametrize("stop, name", [("x\udfffy", "stop"), (["ok", "\udc80"], "stop[1]")])
def test_a_stop_string_with_a_lone_surrogate(stop, name):
    with pytest.raises(InputError) as info:
        speculator().generate("ab", max_new_tokens=2, stop=stop)
    position = 1 if name == "stop" else 0
    assert f"{name} is not valid Unicode text" in str(info.value)
    assert f"at character {position}" in str(info.value)


def test_a_config_stop_string_with_a_lone_surrogate():
    """Refused when the config is loaded, under its config key."""
    with pytest.raises(ConfigError) as info:
        load_spec_config("autoregressive", {"generation.stop": ["fine", "bad\ud800"]})
    assert "generation.stop[1] is not valid Unicode text" in str(info.value)
    assert "at character 3" in str(info.value)
