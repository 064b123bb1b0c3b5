"""generation.seed defaults to None: every sampled call draws a fresh seed from the OS and reports
it in out.stats.seed, and passing that seed back reproduces the sample under both samplers.
Greedy draws nothing and reports no seed."""
from __future__ import annotations

from functools import lru_cache

import pytest

from conftest import char_tokenizer, noisy_copy, tiny_model
from specdec import Speculator
from specdec.config import GenerationDefaults, load_spec_config
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel

PROMPT = "def f"
N = 64          # at temperature 1 a random 96-token model is near uniform: two fresh samples of 64
#                 tokens collide with probability ~ 96**-64


@lru_cache(maxsize=None)
def model_and_tokenizer():
    return tiny_model("llama", seed=0), char_tokenizer()


def speculator(kind: str) -> Speculator:
    model, tok = model_and_tokenizer()
    strategy = Autoregressive() if kind == "autoregressive" else DraftModel(noisy_copy(model), num_tokens=4)
    return Speculator(model, tok, strategy)


def test_the_default_seed_is_none():
    assert GenerationDefaults().seed is None
    assert load_spec_config("autoregressive").generation.seed is None


@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
@pytest.mark.parametrize("kind", ["autoregressive", "draft_model"])
def test_unseeded_calls_differ_and_the_reported_seed_reproduces(kind, sampler):
    sd = speculator(kind)
    args = dict(max_new_tokens=N, temperature=1.0, ignore_eos=True, sampler=sampler)
    first, second = sd.generate(PROMPT, **args), sd.generate(PROMPT, **args)
    assert isinstance(first.stats.seed, int) and isinstance(second.stats.seed, int)
    assert first.stats.seed != second.stats.seed
    assert len(first.token_ids) == len(second.token_ids) == N
    assert first.token_ids != second.token_ids, "two unseeded calls drew the same 64 tokens"
    again = sd.generate(PROMPT, seed=first.stats.seed, **args)
    assert again.token_ids == first.token_ids
    assert again.stats.seed == first.stats.seed
    assert first.stats.as_dict()["seed"] == first.stats.seed


def test_an_explicit_seed_is_reported_and_streams_report_theirs():
    sd = speculator("autoregressive")
    out = sd.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=12345)
    assert out.stats.seed == 12345
    stream = sd.stream(PROMPT, max_new_tokens=N, temperature=1.0, ignore_eos=True)
    text = "".join(stream)
    assert isinstance(stream.stats.seed, int)
    assert sd.generate(PROMPT, max_new_tokens=N, temperature=1.0, ignore_eos=True, seed=stream.stats.seed).text == text


def test_greedy_reports_no_seed_and_ignores_it():
    sd = speculator("draft_model")
    plain = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True)
    seeded = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=7)
    assert plain.stats.seed is None and seeded.stats.seed is None
    assert plain.token_ids == seeded.token_ids


def test_a_config_seed_is_used_and_reported():
    model, tok = model_and_tokenizer()
    cfg = load_spec_config("autoregressive", {"generation.temperature": 1.0, "generation.seed": 3,
                                              "generation.max_new_tokens": 16})
    sd = Speculator(model, tok, Autoregressive(), config=cfg)
    out = sd.generate(PROMPT, ignore_eos=True)
    assert out.stats.seed == 3
    assert out.token_ids == sd.generate(PROMPT, ignore_eos=True).token_ids
