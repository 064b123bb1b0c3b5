"""Transformers warnings that are ours to avoid: the arguments we pass are the ones the installed
Transformers takes (its `past_key_values` -> `cache` rename warned on every forward)."""
from __future__ import annotations

import warnings

import pytest

from conftest import char_tokenizer, tiny_model
import specdec
from specdec.models import cache_keyword


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_warnings")
    for name, seed in (("target", 0), ("draft", 1)):
        tiny_model("llama", seed=seed).save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


@pytest.mark.parametrize("config", ["autoregressive", "draft_model", "prompt_lookup"])
def test_generation_raises_no_deprecation_warnings(config, folders):
    target, draft = folders
    sd = specdec.load(config, **{"target.path": target, "draft.path": draft} if config == "draft_model"
                      else {"target.path": target})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sd.generate("def f(x):", max_new_tokens=6)
        sd.generate("def f(x):", max_new_tokens=6, temperature=0.8, seed=1)
        list(sd.stream("def f(x):", max_new_tokens=6))
    ours = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert ours == []


def test_cache_keyword_is_one_the_forward_takes():
    import inspect
    model = tiny_model("gpt2", seed=0)
    assert cache_keyword(model) in inspect.signature(type(model).forward).parameters
