"""The command line: `specdec generate | train-heads | bench` and `python -m specdec`. Overrides
are YAML values (lists, null) in every subcommand; streaming prints exactly the text generate()
returns, also when a multi-byte character is split across verify steps."""
from __future__ import annotations

import subprocess
import sys

import pytest
import transformers as T

import specdec
from conftest import char_tokenizer, tiny_model
from specdec.cli import main as cli_main
from specdec.errors import ConfigError


def byte_tokenizer():
    """A byte-level BPE (GPT-2 style pre-tokenizer and decoder) trained in-process on a little
    non-ASCII text: most characters outside ASCII are two to four byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["héllo wörld, ça va? naïve café — 東京 😀"] * 4, trainer)
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_models")
    chars, nonascii = char_tokenizer(), byte_tokenizer()
    target, draft, byte_target = root / "target", root / "draft", root / "byte_target"
    tiny_model("llama", seed=0).save_pretrained(target)
    chars.save_pretrained(target)
    tiny_model("llama", seed=1, layers=1).save_pretrained(draft)
    chars.save_pretrained(draft)
    tiny_model("llama", seed=0, vocab=len(nonascii)).save_pretrained(byte_target)
    nonascii.save_pretrained(byte_target)
    return {"target": str(target), "draft": str(draft), "byte_target": str(byte_target)}


# ---------------------------------------------------------------------- item 5: streaming
NONASCII_PROMPT = "héllo wörld 東京 "
SAMPLED = ["generation.temperature=1.0", "generation.seed=0", "generation.max_new_tokens=40"]


def test_cli_stream_survives_a_character_split_across_steps(folders, capsys):
    """At temperature 1 a byte-level model emits multi-byte characters one byte token per step;
    the streamed text must still be the whole completion (the old CLI stopped printing at the
    first split character)."""
    sd = specdec.load("autoregressive", **{"target.path": folders["byte_target"], "device": "cpu"})
    out = sd.generate(NONASCII_PROMPT, max_new_tokens=40, temperature=1.0, seed=0)
    prefixes = [sd.tokenizer.decode(out.token_ids[:k], skip_special_tokens=True) for k in range(1, len(out.token_ids))]
    assert any(not out.text.startswith(p) for p in prefixes), "the case must split a character across steps"
    pieces = list(sd.stream(NONASCII_PROMPT, max_new_tokens=40, temperature=1.0, seed=0))
    assert "".join(pieces) == out.text

    assert cli_main(["generate", "autoregressive", f"target.path={folders['byte_target']}", "device=cpu",
                     *SAMPLED, "--prompt", NONASCII_PROMPT]) == 0
    captured = capsys.readouterr()
    assert captured.out == out.text + "\n"
    assert f"{out.stats.new_tokens} tokens, {out.stats.target_forwards} target forwards" in captured.err


def test_cli_stream_prints_the_stream_stats(folders, capsys):
    """The statistics line after streaming is the stream's own (no second, hidden generation)."""
    assert cli_main(["generate", "draft_model", f"target.path={folders['target']}", f"draft.path={folders['draft']}",
                     "device=cpu", "generation.max_new_tokens=9", "--prompt", "def f", "--echo"]) == 0
    captured = capsys.readouterr()
    sd = specdec.load("draft_model", **{"target.path": folders["target"], "draft.path": folders["draft"],
                                        "device": "cpu"})
    stream = sd.stream("def f", max_new_tokens=9)
    text = "".join(stream)
    assert captured.out == "def f" + text + "\n"
    assert (f"[draft_model] {stream.stats.new_tokens} tokens, {stream.stats.target_forwards} target forwards"
            in captured.err)


# ---------------------------------------------------------------------- item 6: YAML overrides
def test_parse_overrides_reads_yaml_values():
    from specdec.config import parse_overrides
    parsed = parse_overrides(["draft.branching=[2,2,1]", "medusa.choices=[[0],[1],[0,0]]", "generation.stop=[return]",
                              "generation.seed=null", "target.path=/m/target", "generation.top_p=0.9",
                              "draft.adaptive=true", "name=a=b"])
    assert parsed == {"draft.branching": [2, 2, 1], "medusa.choices": [[0], [1], [0, 0]],
                      "generation.stop": ["return"], "generation.seed": None, "target.path": "/m/target",
                      "generation.top_p": 0.9, "draft.adaptive": True, "name": "a=b"}
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides(["draft.num_tokens"])
    with pytest.raises(ConfigError, match=r"'draft.branching=\[2,2'.*not valid YAML"):
        parse_overrides(["draft.branching=[2,2"])


def test_cli_generate_takes_yaml_overrides(folders, capsys, monkeypatch):
    import specdec.loading
    loaded = []

    def recording_load(*args, **kwargs):
        loaded.append(real_load(*args, **kwargs))
        return loaded[-1]
    real_load = specdec.loading.load
    monkeypatch.setattr(specdec.loading, "load", recording_load)
    argv = ["generate", "draft_model", f"target.path={folders['target']}", f"draft.path={folders['draft']}",
            "device=cpu", "draft.branching=[2,2,1]", "draft.max_nodes=6", "medusa.choices=[[0],[1],[0,0]]",
            "generation.stop=[return]", "generation.seed=null", "generation.max_new_tokens=7", "--prompt", "def f",
            "--no-stream"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    cfg = loaded[0].config
    assert list(cfg.draft.branching) == [2, 2, 1] and cfg.draft.max_nodes == 6
    assert [list(c) for c in cfg.medusa.choices] == [[0], [1], [0, 0]]
    assert list(cfg.generation.stop) == ["return"] and cfg.generation.seed is None
    assert loaded[0].strategy.branching == [2, 2, 1]
    expected = loaded[0].generate("def f").text            # greedy: the unseeded run is deterministic
    assert capsys.readouterr().out == expected + "\n"


def test_cli_bad_override_values_read_plainly(folders, capsys):
    code = cli_main(["generate", "draft_model", f"target.path={folders['target']}", "draft.num_tokens=abc",
                     "--prompt", "x"])
    assert code == 2
    err = capsys.readouterr().err
    assert "bad value for 'draft.num_tokens': expected an integer, got 'abc'" in err
    for internal in ("full_key", "object_type", "reference_type", "could not be converted"):
        assert internal not in err


def test_train_heads_takes_yaml_overrides(monkeypatch, tmp_path):
    import specdec.heads.train as train
    seen = []
    monkeypatch.setattr(train, "train_heads", lambda cfg: seen.append(cfg) or str(tmp_path))
    assert cli_main(["train-heads", "train_heads", "target=/m/target", "corpus=[json, email/parser.py]",
                     "heldout=[]", "split_file=null", "num_heads=3"]) == 0
    cfg = seen[0]
    assert list(cfg.corpus) == ["json", "email/parser.py"] and list(cfg.heldout) == []
    assert cfg.split_file is None and cfg.num_heads == 3 and cfg.target == "/m/target"


def test_bench_takes_yaml_overrides(monkeypatch):
    import specdec.benchmarks.run as run
    seen = []

    class Stop(Exception):
        pass

    def recording(preset, overrides):
        seen.append(real(preset, overrides))
        raise Stop
    real = run.load_bench_config
    monkeypatch.setattr(run, "load_bench_config", recording)
    with pytest.raises(Stop):
        run.main(["quick", "only=[autoregressive, draft]", "temperatures=[0.0, 0.7]", "models.draft=null",
                  "seeds=[1,2]"])
    cfg = seen[0]
    assert list(cfg.only) == ["autoregressive", "draft"] and list(cfg.temperatures) == [0.0, 0.7]
    assert cfg.models.draft is None and list(cfg.seeds) == [1, 2]


def test_python_dash_m_specdec_in_process(folders, capsys, monkeypatch):
    """specdec/__main__.py runs the same entry point (as `python -m specdec` does, without paying for a
    second interpreter's torch import; the subprocess test below is marked slow)."""
    import runpy
    monkeypatch.setattr(sys, "argv", ["specdec", "generate", "autoregressive", f"target.path={folders['target']}",
                                      "device=cpu", "generation.max_new_tokens=6", "--prompt", "def f", "--no-stream"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("specdec", run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 0
    captured = capsys.readouterr()
    sd = specdec.load("autoregressive", **{"target.path": folders["target"], "device": "cpu"})
    assert captured.out == sd.generate("def f", max_new_tokens=6).text + "\n"
    monkeypatch.setattr(sys, "argv", ["specdec", "generate", "no_such_config", "--prompt", "x"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("specdec", run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 2 and "unknown config 'no_such_config'" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_specdec(folders):
    """`python -m specdec ...` is the same program as `specdec ...`, in a fresh interpreter."""
    result = subprocess.run([sys.executable, "-m", "specdec", "generate", "autoregressive",
                             f"target.path={folders['target']}", "device=cpu", "generation.max_new_tokens=6",
                             "generation.stop=[xyz]", "--prompt", "def f", "--no-stream"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    sd = specdec.load("autoregressive", **{"target.path": folders["target"], "device": "cpu"})
    assert result.stdout == sd.generate("def f", max_new_tokens=6).text + "\n"
    assert "[autoregressive]" in result.stderr
