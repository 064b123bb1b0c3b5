"""Bad input gets a clear error (the right class from specdec.errors and a message that says
what was wrong); configs load from shipped names, YAML files and overrides; specdec.load and the
CLI work from saved model folders."""
from __future__ import annotations

import string

import pytest
import torch
import transformers as T

import specdec
from conftest import VOCAB, char_tokenizer, hf_greedy, tiny_config, tiny_model
from specdec import Speculator
from specdec.cli import main as cli_main
from specdec.config import load_spec_config
from specdec.errors import ConfigError, IncompatibleModelsError, InputError, ModelLoadError, SpecDecError
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel



def other_char_tokenizer(vocab: int = VOCAB):
    """A character tokenizer of the same size whose ids are assigned in another order."""
    return char_tokenizer(vocab, reverse=True)


def save(folder, model, tokenizer=None) -> str:
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tok = char_tokenizer()
    return {
        "target": save(root / "target", tiny_model("llama", seed=0), tok),
        "draft": save(root / "draft", tiny_model("llama", seed=1, layers=1), tok),
        "draft_no_tokenizer": save(root / "draft_no_tokenizer", tiny_model("llama", seed=1, layers=1)),
        "draft_small_vocab": save(root / "draft_small_vocab", tiny_model("llama", seed=1, vocab=64)),
        "draft_other_tokenizer": save(root / "draft_other_tokenizer", tiny_model("llama", seed=1), other_char_tokenizer()),
        "empty": str(root / "empty"),
    }


@pytest.fixture(scope="module")
def sd():
    return Speculator(tiny_model("llama", seed=0), char_tokenizer(), Autoregressive())


def raises(cls, *phrases):
    """Context manager: the block raises `cls` (a SpecDecError) whose message holds each phrase."""
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            assert isinstance(self.info.value, SpecDecError)
            for phrase in phrases:
                assert phrase in str(self.info.value), f"{phrase!r} not in {str(self.info.value)!r}"
            return handled
    return _Check()


# ---------------------------------------------------------------------- draft / target mismatch
def test_draft_with_smaller_vocab_is_rejected():
    target = tiny_model("llama", seed=0)
    with raises(IncompatibleModelsError, "64", "96", "target's tokenizer"):
        Speculator(target, char_tokenizer(), DraftModel(tiny_model("llama", seed=1, vocab=64)))
    with raises(IncompatibleModelsError, "64", "96"):                     # no tokenizer: model widths
        Speculator(target, None, DraftModel(tiny_model("llama", seed=1, vocab=64)))


def test_draft_with_other_tokenizer_is_rejected():
    target = tiny_model("llama", seed=0)
    draft = DraftModel(tiny_model("llama", seed=1), draft_tokenizer=other_char_tokenizer())
    with raises(IncompatibleModelsError, "tokenizer differs", "same token ids"):
        Speculator(target, char_tokenizer(), draft)
    # the same vocabulary passes
    Speculator(target, char_tokenizer(), DraftModel(tiny_model("llama", seed=1), draft_tokenizer=char_tokenizer()))


def test_load_rejects_mismatched_draft_folders(folders):
    with raises(IncompatibleModelsError, "tokenizer differs"):
        specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft_other_tokenizer"],
                                       "device": "cpu"})
    with raises(IncompatibleModelsError, "64"):
        specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft_small_vocab"],
                                       "device": "cpu"})


# ---------------------------------------------------------------------- prompts and lengths
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_prompt_longer_than_context(arch):
    config = tiny_config(arch)
    config.max_position_embeddings = 16          # gpt2: n_positions, through its attribute map
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    sd = Speculator(model, None, Autoregressive())
    with raises(InputError, "20 tokens", "context is 16"):
        sd.generate(list(range(3, 23)), max_new_tokens=1)
    with raises(InputError, "16 tokens", "context is 16"):
        sd.generate(list(range(3, 19)), max_new_tokens=1)
    with raises(InputError, "max_new_tokens (8)", "context of 16", "lower max_new_tokens to 6"):
        sd.generate(list(range(3, 13)), max_new_tokens=8)
    # exactly filling the context is fine
    assert len(sd.generate(list(range(3, 13)), max_new_tokens=6, ignore_eos=True).token_ids) == 6


def test_batch_size_above_one(sd):
    with raises(InputError, "batch size 2", "not supported yet"):
        sd.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), max_new_tokens=2)
    with raises(InputError, "batch size 2", "not supported yet"):
        sd.generate(["def f", "def g"], max_new_tokens=2)
    with raises(InputError, "batch size 3", "not supported yet"):
        list(sd.stream(["a", "b", "c"], max_new_tokens=2))
    # one row is fine
    assert len(sd.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, ignore_eos=True).token_ids) == 2


@pytest.mark.parametrize("prompt", ["", [], torch.tensor([], dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)])
def test_empty_prompt(sd, prompt):
    with raises(InputError, "prompt is empty"):
        sd.generate(prompt, max_new_tokens=2)


@pytest.mark.parametrize("prompt", [5, 2.5, None, b"def f"])
def test_prompt_of_wrong_type(sd, prompt):
    with raises(InputError, "prompt must be a string or a list of token ids"):
        sd.generate(prompt, max_new_tokens=2)


@pytest.mark.parametrize("bad_id", [VOCAB, 10_000, -1])
def test_prompt_token_outside_vocabulary(sd, bad_id):
    with raises(InputError, f"token id {bad_id}", "vocabulary of 96"):
        sd.generate([3, bad_id, 4], max_new_tokens=2)


def test_text_prompt_without_tokenizer():
    sd = Speculator(tiny_model("llama"), None, Autoregressive())
    with raises(InputError, "needs a tokenizer"):
        sd.generate("def f", max_new_tokens=2)
    with raises(InputError, "needs a tokenizer"):
        list(sd.stream([3, 4], max_new_tokens=2))
    with raises(InputError, "stop strings need a tokenizer"):
        sd.generate([3, 4], max_new_tokens=2, stop="x")


@pytest.mark.parametrize("kwargs, phrases", [
    (dict(temperature=-0.5), ("temperature must be >= 0",)),
    (dict(temperature=1.0, top_p=1.5), ("top_p must be in (0, 1]",)),
    (dict(temperature=1.0, top_p=0.0), ("top_p must be in (0, 1]",)),
    (dict(temperature=1.0, top_k=-1), ("top_k must be an integer >= 0",)),
    (dict(max_new_tokens=0), ("max_new_tokens must be an integer >= 1", "got 0")),
])
def test_bad_generation_arguments(sd, kwargs, phrases):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with raises(InputError, *phrases):
        sd.generate("def f", **kwargs)


# ---------------------------------------------------------------------- strategies
def test_unknown_strategy_object_or_name():
    target = tiny_model("llama")
    with raises(InputError, "unknown strategy 'beam'", "autoregressive"):
        Speculator(target, None, "beam")
    with raises(InputError, "draft_model", "specdec.load"):
        Speculator(target, None, "draft_model")
    with pytest.raises(TypeError, match="must follow specdec.strategies.Strategy"):
        Speculator(target, None, object())


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(num_tokens=0), "draft.num_tokens must be >= 1"),
    (dict(branching=[2, 0]), "draft.branching"),
    (dict(branching=[]), "draft.branching"),
    (dict(min_tokens=5, max_tokens=3), "draft.min_tokens <= draft.max_tokens"),
])
def test_bad_draft_model_arguments(kwargs, phrase):
    with raises(ConfigError, phrase):
        DraftModel(tiny_model("llama", seed=1), **kwargs)


# ---------------------------------------------------------------------- config loading
def test_shipped_configs_load():
    for name, strategy in [("autoregressive", "autoregressive"), ("draft_model", "draft_model"),
                           ("draft_model_tree", "draft_model"), ("draft_model_adaptive", "draft_model")]:
        assert load_spec_config(name).strategy == strategy
    assert list(load_spec_config("draft_model_tree").draft.branching) == [2, 2, 1, 1]
    assert load_spec_config("draft_model_adaptive").draft.adaptive is True


def test_unknown_config_name():
    with raises(ConfigError, "unknown config 'draft_modle'", "did you mean 'draft_model'", "shipped generation configs"):
        load_spec_config("draft_modle")
    with raises(ConfigError, "not found"):
        load_spec_config("/no/such/file.yaml")


@pytest.mark.parametrize("overrides, phrases", [
    ({"draft.num_token": 3}, ("unknown config key 'draft.num_token'", "did you mean 'num_tokens'", "valid keys")),
    ({"generation.temprature": 0.5}, ("'generation.temprature'", "did you mean 'temperature'")),
    ({"strategi": "draft_model"}, ("unknown config key 'strategi'", "did you mean 'strategy'")),
    ({"target.path.sub": "x"}, ("target.path",)),
])
def test_unknown_config_key(overrides, phrases):
    with pytest.raises(ConfigError) as info:
        load_spec_config("draft_model", overrides)
    for phrase in phrases:
        assert phrase in str(info.value)


@pytest.mark.parametrize("overrides, phrase", [
    ({"strategy": "beam_search"}, "unknown strategy 'beam_search'"),
    ({"strategy": "draft_modl"}, "did you mean 'draft_model'"),
    ({"generation.temperature": -1.0}, "generation.temperature must be >= 0"),
    ({"generation.top_p": 1.5}, "generation.top_p must be in (0, 1]"),
    ({"generation.top_k": -2}, "generation.top_k must be an integer >= 0"),
    ({"generation.max_new_tokens": 0}, "generation.max_new_tokens must be an integer >= 1"),
    ({"device": "tpu"}, "device='tpu' is not valid"),
    ({"dtype": "float8"}, "dtype='float8' is not valid"),
    ({"draft.num_tokens": 0}, "draft.num_tokens must be >= 1"),
    ({"draft.max_nodes": 0}, "draft.max_nodes must be >= 1"),
    ({"draft.num_tokens": "many"}, "bad value"),
    ({"generation.temperature": "hot"}, "bad value"),
])
def test_bad_config_values(overrides, phrase):
    with pytest.raises(ConfigError) as info:
        load_spec_config("draft_model", overrides)
    assert phrase in str(info.value)


def test_bad_values_through_load(folders):
    with raises(ConfigError, "generation.temperature must be >= 0"):
        specdec.load("autoregressive", **{"target.path": folders["target"], "generation.temperature": -1})
    with raises(ConfigError, "did you mean 'num_tokens'"):
        specdec.load("draft_model", **{"target.path": folders["target"], "draft.num_token": 3})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of asking for CUDA without it")
def test_cuda_device_without_cuda(folders):
    with raises(ModelLoadError, "CUDA", "device=cpu"):
        specdec.load("autoregressive", **{"target.path": folders["target"], "device": "cuda"})


def test_dotted_overrides_as_list_and_dict():
    a = load_spec_config("draft_model", ["draft.num_tokens=6", "generation.top_k=5", "draft.branching=[3,2]"])
    b = load_spec_config("draft_model", {"draft.num_tokens": 6, "generation.top_k": 5, "draft.branching": [3, 2]})
    for cfg in (a, b):
        assert cfg.draft.num_tokens == 6 and cfg.generation.top_k == 5 and list(cfg.draft.branching) == [3, 2]
    with raises(ConfigError, "not of the form key=value"):
        load_spec_config("draft_model", ["draft.num_tokens"])


def test_yaml_config_files(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("strategy: draft_model\ndraft:\n  num_tokens: 3\n  branching: [2, 1]\ngeneration:\n  top_k: 7\n")
    cfg = load_spec_config(str(path))
    assert cfg.strategy == "draft_model" and cfg.draft.num_tokens == 3
    assert list(cfg.draft.branching) == [2, 1] and cfg.generation.top_k == 7
    assert cfg.draft.max_nodes == 64                       # schema default kept
    # overrides win over the file
    cfg = load_spec_config(str(path), {"draft.num_tokens": 5})
    assert cfg.draft.num_tokens == 5 and cfg.generation.top_k == 7
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text("draft:\n  num_tokenz: 3\n")
    with raises(ConfigError, "unknown config key 'draft.num_tokenz'", "did you mean 'num_tokens'"):
        load_spec_config(str(bad_key))
    bad_value = tmp_path / "bad_value.yaml"
    bad_value.write_text("generation:\n  top_p: 2.0\n")
    with raises(ConfigError, "top_p"):
        load_spec_config(str(bad_value))
    broken = tmp_path / "broken.yaml"
    broken.write_text("draft: [unclosed\n")
    with raises(ConfigError, "broken.yaml"):
        load_spec_config(str(broken))


# ---------------------------------------------------------------------- model folders
def test_missing_model_path(tmp_path):
    with raises(ModelLoadError, "does not exist", "target.path"):
        specdec.load("autoregressive", **{"target.path": str(tmp_path / "nowhere"), "device": "cpu"})


def test_folder_without_config_json(folders, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with raises(ModelLoadError, "has no config.json"):
        specdec.load("autoregressive", **{"target.path": str(tmp_path), "device": "cpu"})


def test_missing_draft_path(folders, tmp_path):
    with raises(ModelLoadError, "draft model path", "does not exist"):
        specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": str(tmp_path / "nowhere"),
                                       "device": "cpu"})
    with raises(ModelLoadError, "no draft model given", "draft.path="):
        specdec.load("draft_model", **{"target.path": folders["target"], "device": "cpu"})


def test_load_autoregressive_from_folder(folders):
    sd = specdec.load("autoregressive", **{"target.path": folders["target"], "device": "cpu"})
    assert sd.target.dtype == torch.float32
    prompt_ids = sd.tokenizer("def f")["input_ids"]
    out = sd.generate("def f", max_new_tokens=12, ignore_eos=True)
    assert out.token_ids == hf_greedy(sd.target, prompt_ids, 12, eos_token_id=None)
    assert out.stats.tokens_per_forward == 1.0


@pytest.mark.parametrize("draft", ["draft", "draft_no_tokenizer"])
@pytest.mark.parametrize("config", ["draft_model", "draft_model_tree", "draft_model_adaptive"])
def test_load_draft_model_from_folder(folders, draft, config):
    sd = specdec.load(config, **{"target.path": folders["target"], "draft.path": folders[draft], "device": "cpu"})
    assert sd.strategy.name == "draft_model"
    plain = specdec.load("autoregressive", **{"target.path": folders["target"], "device": "cpu"})
    out = sd.generate("def f", max_new_tokens=12, ignore_eos=True)
    assert out.token_ids == plain.generate("def f", max_new_tokens=12, ignore_eos=True).token_ids
    assert out.stats.proposed_nodes > 0


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize("stream", [False, True])
def test_cli_generate(folders, capsys, stream):
    argv = ["generate", "draft_model", f"target.path={folders['target']}", f"draft.path={folders['draft']}",
            "device=cpu", "generation.max_new_tokens=8", "--prompt", "def f"]
    if not stream:
        argv.append("--no-stream")
    assert cli_main(argv) == 0
    captured = capsys.readouterr()
    expected = specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"],
                                              "device": "cpu"}).generate("def f", max_new_tokens=8).text
    assert captured.out == expected + "\n"
    assert "target forwards" in captured.err and "tokens/forward" in captured.err


def test_cli_bad_key_returns_2(folders, capsys):
    code = cli_main(["generate", "draft_model", f"target.path={folders['target']}", "draft.num_token=3",
                     "--prompt", "def f", "--no-stream"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown config key 'draft.num_token'" in err and "did you mean 'num_tokens'" in err


@pytest.mark.parametrize("argv, phrase", [
    (["generate", "nonexistent_config", "--prompt", "x"], "unknown config 'nonexistent_config'"),
    (["generate", "autoregressive", "target.path=/no/such/folder", "--prompt", "x"], "does not exist"),
    (["generate", "autoregressive", "generation.top_p=3", "--prompt", "x"], "top_p"),
    (["generate", "autoregressive", "draft.num_tokens", "--prompt", "x"], "not of the form key=value"),
])
def test_cli_errors_return_2(capsys, argv, phrase):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec generate: error:") and phrase in err


class _TooDeep(Autoregressive):
    """Proposes a chain one level deeper than the budget left allows."""
    name = "too_deep"

    def propose(self, state):
        from specdec.tree import CandidateTree
        return CandidateTree.chain([5] * (state.max_depth + 1))


def test_loop_refuses_a_tree_deeper_than_the_budget():
    """The loop never re-indexes a strategy's tree behind its back: an over-deep tree is an error
    naming the strategy and state.max_depth."""
    from specdec.errors import StrategyError
    sd = Speculator(tiny_model("llama"), None, _TooDeep())
    with pytest.raises(StrategyError, match=r"'too_deep'.*4 levels deep.*only 3.*state.max_depth"):
        sd.generate([3, 4, 5], max_new_tokens=4, ignore_eos=True)
