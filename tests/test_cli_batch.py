"""`specdec generate ... --prompts-file F --batch-size N`: every prompt of a JSONL file in one
batched call, one JSON line out per prompt (its index, text, finish reason, stats)."""
from __future__ import annotations

import json

import pytest

import specdec
from conftest import char_tokenizer, tiny_model
from specdec.cli import main as cli_main

LINES = [{"prompt": "def f(x):"}, {"prompt": "class A:", "max_new_tokens": 4}, {"prompt": "import os", "seed": 3},
         {"prompt": "ab", "stop": ["b"]}]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_batch") / "target"
    tiny_model("gpt_neox", seed=0).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)


def write_lines(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_one_json_line_per_prompt_equal_to_generate(target, tmp_path, capsys):
    prompts = write_lines(tmp_path / "prompts.jsonl", LINES)
    out_path = tmp_path / "out.jsonl"
    code = cli_main(["generate", "prompt_lookup", f"target.path={target}", "device=cpu", "generation.max_new_tokens=10",
                     "--prompts-file", prompts, "--batch-size", "2", "--output", str(out_path)])
    assert code == 0
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(len(LINES)))
    sd = specdec.load("prompt_lookup", **{"target.path": target, "device": "cpu", "generation.max_new_tokens": 10})
    for row in rows:
        line = LINES[row["index"]]
        alone = sd.generate(line["prompt"], **{k: v for k, v in line.items() if k != "prompt"})
        assert (row["text"], row["finish_reason"]) == (alone.text, alone.finish_reason)
        assert row["stats"]["new_tokens"] == len(alone.token_ids)
    assert f"{len(LINES)} prompts" in capsys.readouterr().err


@pytest.mark.parametrize("lines, phrase", [
    (["not json"], "line 1 is not JSON"),
    ([{"text": "x"}], "line 1 has no \"prompt\" string"),
    ([{"prompt": "x"}, {"prompt": "y", "temperature": 2}], "line 2: unknown key(s) ['temperature']"),
    ([], "holds no prompts"),
])
def test_bad_prompts_files_are_clear_errors(target, tmp_path, capsys, lines, phrase):
    prompts = write_lines(tmp_path / "bad.jsonl", lines)
    assert cli_main(["generate", "autoregressive", f"target.path={target}", "--prompts-file", prompts]) == 2
    assert phrase in capsys.readouterr().err
