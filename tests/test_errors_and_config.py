"""Bad input gets a clear error (the right class from specdec.errors and a message that says
what was wrong); configs load from shipped names, YAML files and overrides; specdec.load and the
CLI work from saved model folders."""
from __future__ import annotations

import re
import string

import numpy as np
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


def test_a_batch_is_a_list_of_outputs_and_stream_takes_one_prompt(sd):
    outs = sd.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), max_new_tokens=2, ignore_eos=True)
    assert [len(out.token_ids) for out in outs] == [2, 2]
    with raises(InputError, "stream() takes one prompt", "generate()"):
        list(sd.stream(["a", "b", "c"], max_new_tokens=2))
    # one row of a 2-D tensor is one prompt
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


# one table of argument errors: (arguments, phrases the InputError must hold: the argument's name,
# the bad value and what is valid)
BAD_ARGUMENTS = [
    (dict(max_new_tokens=3.5), ("max_new_tokens must be an integer >= 1", "3.5 (float)")),
    (dict(max_new_tokens="10"), ("max_new_tokens must be an integer >= 1", "'10' (str)")),
    (dict(max_new_tokens=True), ("max_new_tokens must be an integer >= 1", "True (bool)")),
    (dict(top_k=2.5, temperature=1.0), ("top_k must be an integer >= 0", "2.5 (float)")),
    (dict(top_k=True, temperature=1.0), ("top_k must be an integer >= 0", "True (bool)")),
    (dict(temperature="0.5"), ("temperature must be a finite number", "'0.5' (str)")),
    (dict(temperature=1e-40), ("temperature must be 0 (greedy) or at least 0.0001", "1e-40",
                               "use temperature=0 for greedy")),
    (dict(temperature=float("nan")), ("temperature must be a finite number", "nan")),
    (dict(temperature=float("inf")), ("temperature must be a finite number", "inf")),
    (dict(temperature=True), ("temperature must be a finite number", "True (bool)")),
    (dict(temperature=1.0, top_p="high"), ("top_p must be a finite number", "'high' (str)")),
    (dict(seed="abc"), ("seed must be None (a fresh random seed) or an integer", "'abc' (str)")),
    (dict(seed=1.5), ("seed must be None", "1.5 (float)")),
    (dict(seed=-1), ("seed must be None", "in [0, 2**64)", "-1")),
    (dict(seed=True), ("seed must be None", "True (bool)")),
    (dict(stop=""), ("stop holds an empty string", "stop after one token", "non-empty stop strings")),
    (dict(stop=["ab", ""]), ("stop holds an empty string",)),
    (dict(stop=5), ("stop must be a string or a list of strings", "5 (int)")),
    (dict(stop=["ab", 3]), ("stop must be a string or a list of strings",)),
    (dict(stop_token_ids=[True]), ("stop_token_ids[0] is True (bool)", "token ids must be integers")),
    (dict(stop_token_ids=["x"]), ("stop_token_ids[0] is 'x' (str)",)),
    (dict(stop_token_ids="ab"), ("stop_token_ids must be a list of integer token ids", "'ab' (str)")),
    (dict(ignore_eos="no"), ("ignore_eos must be True or False", "'no' (str)")),
    (dict(prompt=[3, True, 4]), ("prompt[1] is True (bool)", "token ids must be integers")),
    (dict(prompt=[3, 4.0]), ("prompt[1] is 4.0 (float)", "token ids must be integers")),
    (dict(prompt=[3, "4"]), ("prompt[1] is '4' (str)",)),
    (dict(prompt=torch.tensor([3.0, 4.0])), ("dtype torch.float32", "token ids must be integers")),
    (dict(prompt=np.array([True, False])), ("dtype bool", "token ids must be integers")),
]


@pytest.mark.parametrize("kwargs, phrases", BAD_ARGUMENTS,
                         ids=[",".join(f"{k}={v!r}"[:24] for k, v in kw.items()) for kw, _ in BAD_ARGUMENTS])
@pytest.mark.parametrize("method", ["generate", "stream"])
def test_argument_types_are_clear_errors(sd, method, kwargs, phrases):
    kwargs = {"prompt": "def f", "max_new_tokens": 2, **kwargs}
    with raises(InputError, *phrases):
        list(getattr(sd, method)(**kwargs)) if method == "stream" else sd.generate(**kwargs)


@pytest.mark.parametrize("prompt", [
    [np.int64(3), np.int32(4), 5], np.array([3, 4, 5]), np.array([[3, 4, 5]], dtype=np.int32),
    torch.tensor([3, 4, 5], dtype=torch.int32), (torch.tensor(3), torch.tensor(4), 5),
], ids=["numpy-ints", "numpy-1d", "numpy-2d", "torch-int32", "0d-tensors"])
def test_numpy_and_tensor_integer_ids_are_accepted(sd, prompt):
    expected = sd.generate([3, 4, 5], max_new_tokens=4, ignore_eos=True).token_ids
    unused = next(t for t in range(VOCAB) if t not in expected)
    out = sd.generate(prompt, max_new_tokens=np.int64(4), top_k=np.int32(0), seed=np.uint8(0), ignore_eos=np.bool_(True),
                      stop_token_ids=np.array([unused]))
    assert out.token_ids == expected and len(expected) == 4
    stopped = sd.generate(prompt, max_new_tokens=4, ignore_eos=True, stop_token_ids=np.int64(expected[1]))
    assert stopped.token_ids == expected[:expected.index(expected[1]) + 1] and stopped.finish_reason == "stop"
    # one token: a 0-d array / tensor
    single = sd.generate([3], max_new_tokens=3, ignore_eos=True).token_ids
    assert sd.generate(np.array(3), max_new_tokens=3, ignore_eos=True).token_ids == single
    assert sd.generate(torch.tensor(3), max_new_tokens=3, ignore_eos=True).token_ids == single


def test_sampling_params_refuse_what_would_break_torch():
    with raises(InputError, "temperature must be 0 (greedy) or at least", "use temperature=0 for greedy"):
        specdec.SamplingParams(temperature=1e-40)
    with raises(InputError, "top_k must be an integer >= 0", "2.5"):
        specdec.SamplingParams(temperature=1.0, top_k=2.5)
    params = specdec.SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3))
    assert type(params.temperature) is float and type(params.top_k) is int


def test_context_hints_never_go_negative():
    config = tiny_config("llama")
    config.max_position_embeddings = 16
    torch.manual_seed(0)
    sd = Speculator(T.AutoModelForCausalLM.from_config(config).eval(), None, Autoregressive())
    for prompt_len, max_new_tokens in [(20, 30), (20, 16), (5, 16), (5, 40)]:
        with pytest.raises(InputError) as info:
            sd.generate(list(range(3, 3 + prompt_len)), max_new_tokens=max_new_tokens)
        message = str(info.value)
        assert "context" in message and not re.search(r"-\d", message), message
    with raises(InputError, "max_new_tokens (16)", "context of 16", "at most 11 for this 5-token prompt"):
        sd.generate(list(range(3, 8)), max_new_tokens=16)
    with raises(InputError, "20 tokens", "keep its last 6 tokens"):
        sd.generate(list(range(3, 23)), max_new_tokens=10)


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
    ({"draft.num_token": 3}, ("unknown config key 'draft.num_token'", "did you mean 'draft.num_tokens'", "valid keys")),
    ({"generation.temprature": 0.5}, ("'generation.temprature'", "did you mean 'generation.temperature'")),
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
    ({"generation.temperature": -1.0}, "bad value for 'generation.temperature': -1.0; it must be >= 0"),
    ({"generation.top_p": 1.5}, "bad value for 'generation.top_p': 1.5; it must be <= 1"),
    ({"generation.top_k": -2}, "bad value for 'generation.top_k': -2; it must be >= 0"),
    ({"generation.max_new_tokens": 0}, "bad value for 'generation.max_new_tokens': 0; it must be >= 1"),
    ({"device": "tpu"}, "bad value for 'device': 'tpu'; use one of"),
    ({"dtype": "float8"}, "bad value for 'dtype': 'float8'; use one of"),
    ({"draft.num_tokens": 0}, "bad value for 'draft.num_tokens': 0; it must be >= 1"),
    ({"draft.max_nodes": 0}, "bad value for 'draft.max_nodes': 0; it must be >= 1"),
    ({"draft.num_tokens": "many"}, "bad value"),
    ({"generation.temperature": "hot"}, "bad value"),
])
def test_bad_config_values(overrides, phrase):
    with pytest.raises(ConfigError) as info:
        load_spec_config("draft_model", overrides)
    assert phrase in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    ({"draft.num_tokens": "abc"}, "bad value for 'draft.num_tokens': expected an integer, got 'abc'"),
    (["draft.num_tokens=abc"], "bad value for 'draft.num_tokens': expected an integer, got 'abc'"),
    (["draft.num_tokens=3.5"], "bad value for 'draft.num_tokens': expected an integer, got 3.5"),
    (["draft.branching=[2,x]"], "bad value for 'draft.branching': expected a list of integers or null, got [2, 'x']"),
    (["medusa.choices=[0,1]"], "bad value for 'medusa.choices': expected a list of lists of integers or null, "
                               "got [0, 1]"),
    (["draft.adaptive=maybe"], "bad value for 'draft.adaptive': expected true or false, got 'maybe'"),
    (["generation.stop=return"], "bad value for 'generation.stop': expected a list of strings, got 'return'"),
    (["generation.seed=abc"], "bad value for 'generation.seed': expected an integer or null, got 'abc'"),
    (["generation.temperature=hot"], "bad value for 'generation.temperature': expected a number, got 'hot'"),
    (["draft=5"], "bad value for 'draft': expected a mapping with keys path, num_tokens,"),
])
def test_bad_values_read_plainly(overrides, message):
    """No OmegaConf internals: the key, what it expects in words, and the value given."""
    with pytest.raises(ConfigError) as info:
        load_spec_config("draft_model", overrides)
    text = str(info.value)
    assert text.startswith(message), text
    for internal in ("full_key", "object_type", "reference_type", "could not be converted", "\n"):
        assert internal not in text, text


def test_bad_value_in_a_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("strategy: draft_model\ndraft:\n  num_tokens: many\n")
    with raises(ConfigError, "bad value for 'draft.num_tokens'", "mine.yaml", "expected an integer, got 'many'"):
        load_spec_config(str(path))


def test_only_generation_configs_are_listed_for_load():
    """train_heads.yaml and default_family.yaml ship in configs/ too, but specdec.load() takes only
    generation configs (those with a top-level strategy: key) and lists only those."""
    from specdec.config import SpecConfig, is_config_of, shipped_config_names
    from specdec.heads.config import TrainHeadsConfig
    names = shipped_config_names(schema_cls=SpecConfig)
    assert {"autoregressive", "draft_model", "prompt_lookup", "medusa"} <= set(names)
    assert "train_heads" not in names and "default_family" not in names
    for name in names:                                   # every listed name loads
        assert load_spec_config(name).strategy
    assert shipped_config_names(schema_cls=TrainHeadsConfig) == ["train_heads"]
    # the rule also classifies configs added beside these: eagle.yaml (a strategy) and train_eagle.yaml
    assert is_config_of({"strategy", "eagle"}, SpecConfig)
    assert not is_config_of({"target", "output_dir", "drafter", "num_layers"}, SpecConfig)
    assert not is_config_of({"strategy", "target"}, TrainHeadsConfig)
    for shipped in ("train_heads", "default_family"):
        with pytest.raises(ConfigError) as info:
            specdec.load(shipped)
        text = str(info.value)
        assert f"config {shipped!r} is shipped but is not a generation config" in text
        listing = text.split("shipped generation configs: ")[1].split(";")[0].split(", ")
        assert listing == names


def test_train_heads_hints_name_its_own_keys(tmp_path, capsys):
    """train-heads' target key is `target=` (not `target.path=` as in generation configs)."""
    assert cli_main(["train-heads", f"target={tmp_path / 'nowhere'}", f"output_dir={tmp_path / 'out'}",
                     "corpus=[json]"]) == 2
    err = capsys.readouterr().err
    assert "give target= " in err and "target.path" not in err, err


def test_bad_values_through_load(folders):
    with raises(ConfigError, "bad value for 'generation.temperature': -1.0; it must be >= 0"):
        specdec.load("autoregressive", **{"target.path": folders["target"], "generation.temperature": -1})
    with raises(ConfigError, "did you mean 'draft.num_tokens'"):
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
    with raises(ConfigError, "unknown config key 'draft.num_tokenz'", "did you mean 'draft.num_tokens'"):
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
    assert "unknown config key 'draft.num_token'" in err and "did you mean 'draft.num_tokens'" in err


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


@pytest.mark.parametrize("section, strategy_path", [
    ("draft", "specdec.strategies.draft_model:DraftModel"),
    ("prompt_lookup", "specdec.strategies.prompt_lookup:PromptLookup"),
    ("medusa", "specdec.strategies.medusa:Medusa"),
])
def test_strategy_defaults_are_the_config_defaults(section, strategy_path):
    """One source of defaults: a strategy built in code behaves like one built from the config."""
    import dataclasses
    import importlib
    import inspect
    from specdec.config import SpecConfig
    module, cls = strategy_path.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
    section_cls = type(getattr(SpecConfig(), section))
    checked = 0
    for f in dataclasses.fields(section_cls):
        if f.name in params:
            assert params[f.name].default == f.default, f"{cls}({f.name}=...) default differs from {section}.{f.name}"
            checked += 1
    assert checked >= 2
