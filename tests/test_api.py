"""The public surface of DESIGN.md, exactly as written there."""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import specdec
from conftest import char_tokenizer, hf_greedy, tiny_model
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel


PROMPT = "def f"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_models")
    tok = char_tokenizer()
    target, draft = root / "target", root / "draft"
    tiny_model("gpt_neox", seed=0).save_pretrained(target)
    tok.save_pretrained(target)
    tiny_model("gpt_neox", seed=1, layers=1).save_pretrained(draft)
    tok.save_pretrained(draft)
    return {"target": str(target), "draft": str(draft)}


@pytest.fixture(scope="module")
def sd(folders):
    return specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"]})


def test_top_level_names():
    for name in ["load", "Speculator", "CandidateTree", "SamplingParams", "GenerationOutput", "Stats",
                 "SpecDecError", "ConfigError", "InputError", "ModelLoadError", "IncompatibleModelsError"]:
        assert hasattr(specdec, name), name
    assert isinstance(specdec.__version__, str)
    strategies = importlib.import_module("specdec.strategies")   # DESIGN.md's namespace layout
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
    assert sd.config.draft.num_tokens == 4
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
