"""`specdec generate` prints the finish reason with its statistics, and Ctrl-C during generation
prints the text generated so far and a one-line note, and exits with 130 (no traceback)."""
from __future__ import annotations

import pytest

import specdec
from conftest import char_tokenizer, tiny_model
from specdec.cli import main as cli_main
from specdec.strategies.autoregressive import Autoregressive

PROMPT = "def f"
BEFORE_CTRL_C = 5          # verify steps (one token each, autoregressive) that finish before Ctrl-C


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_generate") / "target"
    tiny_model("gpt_neox", seed=0).save_pretrained(folder)     # no special token in its first 24 greedy tokens
    char_tokenizer().save_pretrained(folder)
    return str(folder)


def argv(target: str, *extra: str) -> list[str]:
    return ["generate", "autoregressive", f"target.path={target}", "device=cpu", "generation.max_new_tokens=12",
            *extra, "--prompt", PROMPT]


def reference(target: str, **kwargs):
    return specdec.load("autoregressive", **{"target.path": target, "device": "cpu"}).generate(
        PROMPT, max_new_tokens=12, **kwargs)


@pytest.mark.parametrize("mode", [[], ["--no-stream"]])
def test_generate_prints_the_finish_reason(target, capsys, mode):
    assert cli_main(argv(target, *mode)) == 0
    out = reference(target)
    captured = capsys.readouterr()
    assert captured.out == out.text + "\n"
    assert f"{out.stats.new_tokens} tokens" in captured.err
    assert f"finish reason: {out.finish_reason}" in captured.err
    assert out.finish_reason == "length", "precondition: no EOS in 12 tokens"


def test_generate_reports_a_stop_string(target, capsys):
    out = reference(target)
    stop = out.text[3:5]
    assert cli_main(argv(target, f"generation.stop=[{stop!r}]")) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n").endswith(stop)
    assert "finish reason: stop" in captured.err


@pytest.mark.parametrize("mode", [[], ["--no-stream"]])
def test_ctrl_c_prints_the_text_so_far_and_exits_130(target, capsys, monkeypatch, mode):
    calls = []
    real_propose = Autoregressive.propose

    def interrupted_propose(self, state):
        calls.append(len(state.token_ids))
        if len(calls) > BEFORE_CTRL_C:
            raise KeyboardInterrupt
        return real_propose(self, state)

    monkeypatch.setattr(Autoregressive, "propose", interrupted_propose)
    assert cli_main(argv(target, *mode)) == 130
    captured = capsys.readouterr()
    monkeypatch.undo()
    full = reference(target).token_ids
    assert len(full) > BEFORE_CTRL_C, "precondition: the call would go on past the Ctrl-C"
    expected = full[:BEFORE_CTRL_C]
    tokenizer = char_tokenizer()
    assert captured.out == tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    lines = captured.err.strip().splitlines()      # (transformers' weight-loading bars come first)
    assert lines[-1] == (f"specdec generate: interrupted (Ctrl-C) after {BEFORE_CTRL_C} new tokens; the text above "
                         f"is what was generated so far")
    assert sum("interrupted" in line for line in lines) == 1 and "finish reason" not in captured.err
    assert "Traceback" not in captured.err


def test_ctrl_c_while_loading_exits_130(target, capsys, monkeypatch):
    import specdec.loading

    def interrupted_load(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(specdec.loading, "load", interrupted_load)
    assert cli_main(argv(target)) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "specdec generate: interrupted (Ctrl-C) before generating"
