"""The public surface of docs/architecture.md ("Config, API, CLI"), exactly as written there."""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import specdec
from conftest import char_tokenizer, hf_greedy, save_target_and_draft, tiny_model
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel


PROMPT = "def f"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_target_and_draft(tmp_path_factory.mktemp("api_models"), "gpt_neox")


@pytest.fixture(scope="module")
def sd(folders):
    return specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"]})


def test_top_level_names():
    for name in ["load", "Speculator", "CandidateTree", "SamplingParams", "GenerationOutput", "Stats",
                 "SpecDecError", "ConfigError", "InputError", "ModelLoadError", "IncompatibleModelsError"]:
        assert hasattr(specdec, name), name
    assert isinstance(specdec.__version__, str)
    strategies = importlib.import_module("specdec.strategies")   # the namespace layout of docs/architecture.md
    assert hasattr(strategies, "Strategy") and hasattr(strategies, "REGISTRY")


def test_generate_and_stream_signatures():
    for method in (specdec.Speculator.generate, specdec.Speculator.stream):
        params = inspect.signature(method).parameters
        for name in ["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed"]:
            assert name in params, (method.__name__, name)
    assert inspect.signature(specdec.load).parameters["config"].kind is inspect.Parameter.POSITIONAL_ONLY


def test_load_generate_as_documented(sd, folders):
    out = sd.generate(PROMPT, max_new_tokens=12, temperature=0.0, top_k=0, top_p=1.0, seed=0)
    assert isinstance(out, specdec.GenerationOutput)
    prompt_ids = sd.tokenizer(PROMPT)["input_ids"]
    expected = hf_greedy(sd.target, prompt_ids, 12)          # new tokens only, HF's default stopping
    assert out.token_ids == expected
    assert out.text == sd.tokenizer.decode(expected, skip_special_tokens=True)
    assert 1 <= len(out.token_ids) <= 12                      # the prompt is not part of it
    stats = out.stats
    assert stats.new_tokens == len(out.token_ids)
    assert 1 <= stats.target_forwards <= stats.new_tokens
    assert stats.tokens_per_forward == pytest.approx(stats.new_tokens / stats.target_forwards)
    assert out.finish_reason in ("eos", "stop", "length")
    assert set(stats.as_dict()) >= {"new_tokens", "target_forwards", "tokens_per_forward", "acceptance_rate",
                                    "draft_time_s", "verify_time_s", "other_time_s", "total_time_s"}
    assert len(stats.accepted_lengths) == stats.target_forwards


def test_stream_as_documented(sd):
    pieces = []
    for piece in sd.stream(PROMPT, max_new_tokens=12):
        assert isinstance(piece, str) and piece
        pieces.append(piece)
    assert "".join(pieces) == sd.generate(PROMPT, max_new_tokens=12).text


def test_prompt_forms_give_the_same_tokens(sd):
    ids = sd.tokenizer(PROMPT)["input_ids"]
    by_text = sd.generate(PROMPT, max_new_tokens=10, ignore_eos=True).token_ids
    assert sd.generate(ids, max_new_tokens=10, ignore_eos=True).token_ids == by_text
    assert sd.generate(tuple(ids), max_new_tokens=10, ignore_eos=True).token_ids == by_text
    assert sd.generate(torch.tensor(ids), max_new_tokens=10, ignore_eos=True).token_ids == by_text
    assert sd.generate(torch.tensor([ids]), max_new_tokens=10, ignore_eos=True).token_ids == by_text
    assert len(by_text) == 10


def test_speculator_from_objects_in_hand():
    model, tok = tiny_model("qwen2", seed=0), char_tokenizer()
    draft = tiny_model("qwen2", seed=1, layers=1)
    ids = tok(PROMPT)["input_ids"]
    expected = hf_greedy(model, ids, 10)
    for strategy in (Autoregressive(), "autoregressive", DraftModel(draft, num_tokens=3),
                     DraftModel(draft, branching=[2, 2])):
        out = specdec.Speculator(model, tok, strategy).generate(PROMPT, max_new_tokens=10)
        assert out.token_ids == expected, strategy
        assert out.text == tok.decode(expected, skip_special_tokens=True)


def test_speculator_without_tokenizer_takes_ids():
    model = tiny_model("gpt2", seed=0)
    sd = specdec.Speculator(model, None, "autoregressive")
    out = sd.generate([5, 6, 7], max_new_tokens=6, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, [5, 6, 7], 6, eos_token_id=None)
    assert out.text == ""


def test_loaded_config_is_reachable(sd):
    """The loaded config is reachable (the CLI reads generation defaults from it)."""
    assert sd.config.strategy == "draft_model"
    from omegaconf import OmegaConf
    from specdec.config import find_config_file
    shipped = OmegaConf.load(find_config_file("draft_model")).draft           # configs/draft_model.yaml
    assert sd.config.draft.num_tokens == shipped.num_tokens == sd.strategy.num_tokens
    assert sd.config.draft.table_chain == shipped.table_chain == sd.strategy.table_chain
    assert sd.strategy.name == "draft_model"


def test_sampling_call_as_documented(sd):
    a = sd.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_k=20, top_p=0.95, seed=7, ignore_eos=True)
    b = sd.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_k=20, top_p=0.95, seed=7, ignore_eos=True)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    pieces = "".join(sd.stream(PROMPT, max_new_tokens=12, temperature=0.9, top_k=20, top_p=0.95, seed=7,
                               ignore_eos=True))
    assert pieces == a.text


def test_load_with_list_overrides(folders):
    sd = specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"],
                                        "draft.branching": [2, 2, 1], "draft.max_nodes": 6})
    assert sd.strategy.branching == [2, 2, 1] and sd.strategy.max_nodes == 6
    plain = specdec.load("autoregressive", **{"target.path": folders["target"]})
    assert (sd.generate(PROMPT, max_new_tokens=10, ignore_eos=True).token_ids
            == plain.generate(PROMPT, max_new_tokens=10, ignore_eos=True).token_ids)


# ---------------------------------------------------------------------- the stream object
def test_stream_object_fills_stats_and_finish_reason(sd):
    stream = sd.stream(PROMPT, max_new_tokens=12, ignore_eos=True)
    assert stream.finish_reason is None and stream.stats.new_tokens == 0
    first = next(stream)
    assert first and stream.stats.target_forwards >= 1 and stream.stats.new_tokens == len(stream.token_ids)
    rest = "".join(stream)
    out = sd.generate(PROMPT, max_new_tokens=12, ignore_eos=True)
    assert first + rest == out.text and stream.token_ids == out.token_ids
    assert stream.finish_reason == out.finish_reason == "length"
    assert stream.stats.new_tokens == 12 and stream.stats.target_forwards == out.stats.target_forwards
    assert list(stream) == []                                  # an exhausted stream stays exhausted


def test_closed_stream_frees_the_speculator(sd):
    with sd.stream(PROMPT, max_new_tokens=12) as stream:
        next(stream)
    assert list(stream) == []                                  # closed: nothing more, no error
    assert "".join(sd.stream(PROMPT, max_new_tokens=12)) == sd.generate(PROMPT, max_new_tokens=12).text


# ---------------------------------------------------------------------- item 7: one call at a time
def _speculators():
    model, tok = tiny_model("llama", seed=0), char_tokenizer()
    draft = tiny_model("llama", seed=1, layers=1)
    return {"autoregressive": specdec.Speculator(model, tok, "autoregressive"),
            "draft_model": specdec.Speculator(model, tok, DraftModel(draft, num_tokens=3))}


@pytest.mark.parametrize("strategy", ["autoregressive", "draft_model"])
def test_interleaved_streams_each_give_their_own_text(strategy):
    """Every call runs on a KV cache and strategy state of its own: a newer stream started while
    an older one is unfinished leaves it intact, whatever order they are advanced in."""
    sd = _speculators()[strategy]
    kwargs = dict(max_new_tokens=16, ignore_eos=True)
    first_text = sd.generate("def f", **kwargs).text
    second_text = sd.generate("class A", **kwargs).text
    first = sd.stream("def f", **kwargs)
    head = next(first)
    second = sd.stream("class A", **kwargs)
    second_head = next(second)
    assert head + next(first) + "".join(first) == first_text
    assert second_head + "".join(second) == second_text


@pytest.mark.parametrize("strategy", ["autoregressive", "draft_model"])
def test_a_stream_resumes_after_other_calls(strategy):
    sd = _speculators()[strategy]
    kwargs = dict(max_new_tokens=16, ignore_eos=True)
    expected = sd.generate("def f", **kwargs).text
    paused = sd.stream("def f", **kwargs)
    head = next(paused)
    assert sd.generate("class A", **kwargs).text == sd.generate("class A", **kwargs).text
    assert head + "".join(paused) == expected
    # a stream that finished is not affected by later calls
    sd.generate("class A", **kwargs)
    assert list(paused) == []


def test_a_bad_call_does_not_supersede_a_running_stream(sd):
    stream = sd.stream(PROMPT, max_new_tokens=12)
    head = next(stream)
    with pytest.raises(specdec.InputError):
        sd.generate(PROMPT, max_new_tokens=0)
    assert head + "".join(stream) == sd.generate(PROMPT, max_new_tokens=12).text


# ---------------------------------------------------------------------- item 8: config defaults
def test_generation_config_sets_the_call_defaults(folders):
    settings = {"generation.max_new_tokens": 7, "generation.temperature": 0.8, "generation.top_k": 20,
                "generation.top_p": 0.9, "generation.seed": 3, "generation.stop": ["zz"]}
    sd = specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"], **settings})
    explicit = dict(max_new_tokens=7, temperature=0.8, top_k=20, top_p=0.9, seed=3, stop=["zz"])
    out = sd.generate(PROMPT, ignore_eos=True)
    assert out.token_ids == sd.generate(PROMPT, ignore_eos=True, **explicit).token_ids
    assert len(out.token_ids) == 7 or out.finish_reason == "stop"
    assert "".join(sd.stream(PROMPT, ignore_eos=True)) == out.text
    # the seed is the config's: another seed gives another sample
    others = {tuple(sd.generate(PROMPT, ignore_eos=True, seed=s).token_ids) for s in range(4, 8)}
    assert others != {tuple(out.token_ids)}
    # explicit arguments win
    assert len(sd.generate(PROMPT, max_new_tokens=11, temperature=0.0, ignore_eos=True).token_ids) == 11
    greedy = sd.generate(PROMPT, max_new_tokens=11, temperature=0.0, ignore_eos=True).token_ids
    assert greedy == hf_greedy(sd.target, sd.tokenizer(PROMPT)["input_ids"], 11, eos_token_id=None)
    assert sd.generate(PROMPT, seed=None, ignore_eos=True).finish_reason in ("length", "stop")


def test_speculator_without_config_keeps_the_builtin_defaults():
    model = tiny_model("gpt2", seed=0)
    sd = specdec.Speculator(model, char_tokenizer(), "autoregressive")
    out = sd.generate(PROMPT, ignore_eos=True)
    assert len(out.token_ids) == 128                                   # max_new_tokens=128, greedy
    assert out.token_ids == hf_greedy(model, sd.tokenizer(PROMPT)["input_ids"], 128, eos_token_id=None)
