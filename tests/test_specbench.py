"""The bench on a Spec-Bench question file: turns answered one after another, answer files in
Spec-Bench's schema, Spec-Bench's figures, and their own evaluation/speed.py reading our files (with
a checkout of their repository in SPECDEC_SPEC_BENCH; skipped without one)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import char_tokenizer, save_bench_family
from specdec.benchmarks.config import load_bench_config
from specdec.benchmarks.questions import REPEAT_TURN, load_questions, turn_prompt
from specdec.benchmarks.run import main
from specdec.benchmarks.specbench import answer_ids, tokens_per_step
from specdec.errors import ConfigError, InputError

REPO = os.path.join(os.path.dirname(__file__), "..")
PROOF = os.path.join(REPO, "scripts", "interop", "specbench_speed.py")
SPEC_BENCH = os.environ.get("SPECDEC_SPEC_BENCH")      # a checkout of github.com/hemingkx/Spec-Bench
N = 12
QUESTIONS = [{"question_id": 7, "category": "writing", "turns": ["def add(a, b):\n", "\n# again:\n"]},
             {"question_id": 8, "category": "writing", "turns": ["for i in range(10):\n"]},
             {"question_id": 9, "category": "qa", "turns": ["class Point:\n    def __init__(self"]}]
ANSWER_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}

PRESET = f"""
name: specbench_test
models: {{device: cpu, dtype: float32}}
strategies:
  - {{label: autoregressive, config: autoregressive}}
  - {{label: prompt_lookup, config: prompt_lookup, overrides: [prompt_lookup.min_ngram=1]}}
  - {{label: draft_model, config: draft_model, overrides: [draft.num_tokens=3]}}
peers:
  - {{label: HF generate(), kind: plain}}
  - {{label: HF assistant, kind: assistant}}
temperatures: [0.0]
max_new_tokens: {N}
warmup_tokens: 4
progress: false
threads: 1
"""


def _write_jsonl(path, items) -> str:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return str(path)


@pytest.fixture(scope="module")
def tiny_family(tmp_path_factory):
    """A tiny Llama target and, as its draft, the target without its last layer, with a character tokenizer."""
    return save_bench_family(tmp_path_factory.mktemp("family"))


@pytest.fixture(scope="module")
def run(tiny_family, tmp_path_factory):
    """The bench on QUESTIONS; (exit code, results.json, output_dir)."""
    work = tmp_path_factory.mktemp("specbench")
    preset = work / "preset.yaml"
    preset.write_text(PRESET)
    questions = _write_jsonl(work / "question.jsonl", QUESTIONS)
    out = work / "out"
    code = main([str(preset), f"questions={questions}", f"models.dir={tiny_family}", f"output_dir={out}"])
    with open(out / "results.json") as fh:
        return code, json.load(fh), out


def _answers(out, model_id) -> list[dict]:
    with open(out / "model_answer" / f"{model_id}.jsonl") as fh:
        return [json.loads(line) for line in fh]


# ---------------------------------------------------------------------- the question file
def test_load_questions_reads_the_schema_and_refuses_what_is_not(tmp_path):
    questions = load_questions(_write_jsonl(tmp_path / "q.jsonl", QUESTIONS))
    assert [(q.question_id, q.category, len(q.turns)) for q in questions] == [(7, "writing", 2), (8, "writing", 1),
                                                                              (9, "qa", 1)]
    assert len(load_questions(str(tmp_path / "q.jsonl"), limit=2)) == 2
    bad = {"no turns": {"question_id": 1, "category": "qa"}, "empty turns": {"question_id": 1, "category": "qa", "turns": []}}
    for what, item in bad.items():
        with pytest.raises(InputError, match="turns"):
            load_questions(_write_jsonl(tmp_path / "bad.jsonl", [item]))
    with pytest.raises(InputError, match="repeat"):
        load_questions(_write_jsonl(tmp_path / "twice.jsonl", QUESTIONS[:1] * 2))
    with pytest.raises(InputError, match="does not exist"):
        load_questions(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="turns"):            # before any model is looked for
        main(["specbench", f"questions={tmp_path / 'bad.jsonl'}", f"models.target={tmp_path / 'no_model'}"])


def test_a_turn_without_a_chat_template_continues_the_conversation_text():
    tokenizer = char_tokenizer()
    turns = ["def f(x):\n", "\n# again:\n"]
    assert turn_prompt(tokenizer, turns, []) == tokenizer(turns[0])["input_ids"]
    assert turn_prompt(tokenizer, turns, ["    return x"]) == tokenizer("def f(x):\n    return x\n# again:\n")["input_ids"]


def test_a_turn_with_a_chat_template_puts_turns_and_answers_in_their_roles():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}[assistant] {% endif %}")
    ids = turn_prompt(tokenizer, ["a?", "b?", "c?"], ["A."])
    assert tokenizer.decode(ids) == "[user] a?\n[assistant] A.\n[user] b?\n[assistant] "


def test_tokens_per_step_are_the_accepted_plus_one_and_the_last_step_is_cut():
    assert tokens_per_step([0, 2, 1], 6) == [1, 3, 2]
    assert tokens_per_step([0, 2, 3], 5) == [1, 3, 1]          # max_new_tokens cut the last step's run
    for accepted, new_tokens in (([0, 0], 5), ([0, 2], 1), ([], 1)):
        with pytest.raises(ValueError, match="cannot have yielded"):
            tokens_per_step(accepted, new_tokens)


def test_answer_ids_follow_spec_bench_naming_and_never_share_a_file():
    from types import SimpleNamespace as Row
    rows = [Row(label="prompt_lookup", kind="specdec"), Row(label="HF generate()", kind="hf")]
    assert answer_ids(rows, "m", "float16", [0.0, 0.8]) == {
        ("prompt_lookup", 0.0): "m-prompt-lookup-float16-temp-0.0", ("prompt_lookup", 0.8): "m-prompt-lookup-float16-temp-0.8",
        ("HF generate()", 0.0): "m-vanilla-float16-temp-0.0", ("HF generate()", 0.8): "m-vanilla-float16-temp-0.8"}
    with pytest.raises(ConfigError, match="same answer file m-prompt-lookup"):
        answer_ids(rows + [Row(label="Prompt lookup", kind="specdec")], "m", "float16", [0.0])


def test_questions_and_batches_or_repeats_are_refused():
    with pytest.raises(ConfigError, match="batch_sizes"):
        load_bench_config("specbench", ["questions=q.jsonl", "batch_sizes=[2]"])
    with pytest.raises(ConfigError, match="repeats"):
        load_bench_config("specbench", ["questions=q.jsonl", "repeats=2"])


# ---------------------------------------------------------------------- the run and its answer files
def test_every_row_writes_an_answer_file_in_spec_bench_schema(run, tiny_family):
    code, results, out = run
    assert code == 0
    part = results["specbench"]
    ids = {f["row"]: f["model_id"] for f in part["answer_files"]}
    prefix = tiny_family.name                 # models.dir's name
    assert ids == {row: f"{prefix}-{method}-float32-temp-0.0" for row, method in (
        ("autoregressive", "autoregressive"), ("prompt_lookup", "prompt-lookup"), ("draft_model", "draft-model"),
        ("HF generate()", "vanilla"))}
    assert any("HF assistant" in note and "left out" in note for note in results["notes"])
    records = results["records"]
    for row, name in ids.items():
        answers = _answers(out, name)
        assert [a["question_id"] for a in answers] == [q["question_id"] for q in QUESTIONS]
        for answer, question in zip(answers, QUESTIONS):
            assert set(answer) == ANSWER_KEYS and answer["model_id"] == name
            assert answer["category"] == question["category"]
            (choice,) = answer["choices"]
            assert set(choice) == CHOICE_KEYS and choice["index"] == 0
            assert len(choice["turns"]) == len(choice["new_tokens"]) == len(question["turns"])
            assert choice["new_tokens"] == [N] * len(question["turns"])
            assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
            assert sum(choice["decoding_steps"]) == len(choice["accept_lengths"])
            mine = sorted((r for r in records if r["row"] == row and r["question_id"] == question["question_id"]),
                          key=lambda r: r["turn"])
            assert choice["wall_time"] == [r["time_s"] for r in mine]
            if row == "HF generate()":                  # Spec-Bench's baseline: one token per step
                assert choice["accept_lengths"] == [1] * sum(choice["new_tokens"])
            else:
                assert choice["decoding_steps"] == [r["stats"]["target_forwards"] for r in mine]
    drafted = [n for a in _answers(out, ids["draft_model"]) for n in a["choices"][0]["accept_lengths"]]
    assert max(drafted) > 1, "precondition: the draft model's steps yielded more than one token"


def test_turns_are_answered_one_after_another_from_the_rows_own_answers(run, tiny_family):
    _, results, out = run
    tokenizer = char_tokenizer()
    for entry in results["specbench"]["answer_files"]:
        first = _answers(out, entry["model_id"])[0]
        answer_1 = first["choices"][0]["turns"][0]
        turn_2 = next(r for r in results["records"] if r["row"] == entry["row"] and r["question_id"] == 7
                      and r["turn"] == 1)
        expected = tokenizer(QUESTIONS[0]["turns"][0] + answer_1 + QUESTIONS[0]["turns"][1])["input_ids"]
        assert turn_2["prompt_tokens"] == len(expected)
    assert all(r["identical"] for r in results["records"])            # greedy: every turn as HF plain's


def test_spec_bench_figures_are_means_over_questions(run):
    _, results, out = run
    figures = {(e["row"], e["task"]): e for e in results["specbench"]["figures"]}
    assert {task for _, task in figures} == {"writing", "qa", "overall"}
    assert figures[("HF generate()", "overall")]["speedup"] == pytest.approx(1.0)
    assert figures[("autoregressive", "overall")]["mean_accepted_tokens"] == 1.0
    for (row, task), entry in figures.items():
        recs = [r for r in results["records"] if r["row"] == row and (task == "overall" or r["prompt_set"] == task)]
        per_question = {}
        for r in recs:
            tokens, time_s = per_question.get(r["question_id"], (0, 0.0))
            per_question[r["question_id"]] = (tokens + r["new_tokens"], time_s + r["time_s"])
        speeds = [tokens / time_s for tokens, time_s in per_question.values()]
        assert entry["tokens_per_second"] == pytest.approx(sum(speeds) / len(speeds))
        steps = [len(r["step_tokens"]) for r in recs]
        assert entry["mean_accepted_tokens"] == pytest.approx(sum(r["new_tokens"] for r in recs) / sum(steps))
    assert "Spec-Bench's figures" in (out / "results.md").read_text()


def test_the_questions_command_cuts_code_and_repeat_questions_from_held_out_files(tiny_family, tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    for k in range(4):
        (source / f"m{k}.py").write_text("".join(f"def f{k}_{i}(x):\n    return x * {i}\n\n" for i in range(20)))
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"heldout": ["m1.py", "m3.py"]}))
    out = tmp_path / "questions.jsonl"
    assert main(["questions", str(out), f"models.target={tiny_family / 'target'}", "prompts.num=3", "prompts.tokens=40",
                 f"prompts.split={split}", f"prompts.source_dir={source}"]) == 0
    questions = [json.loads(line) for line in out.read_text().splitlines()]
    assert [q["category"] for q in questions] == ["code"] * 3 + ["repeat"] * 3
    assert [q["question_id"] for q in questions] == [1, 2, 3, 4, 5, 6]
    for q in questions:
        assert q["source"]["file"] in ("m1.py", "m3.py")              # held-out files only
        assert q["turns"][1:] == ([REPEAT_TURN] if q["category"] == "repeat" else [])
        text = (source / q["source"]["file"]).read_text()
        assert q["turns"][0] in text and len(q["turns"][0]) == 40      # a window of 40 characters of the file
    assert len(load_questions(str(out))) == 6
    assert "6 questions" in capsys.readouterr().out


# ---------------------------------------------------------------------- Spec-Bench's own speed.py
needs_spec_bench = pytest.mark.skipif(
    not SPEC_BENCH or not os.path.isfile(os.path.join(SPEC_BENCH, "evaluation", "speed.py")),
    reason="no Spec-Bench checkout: set SPECDEC_SPEC_BENCH to a checkout of github.com/hemingkx/Spec-Bench")


def _proof(output_dir):
    return subprocess.run([sys.executable, PROOF, SPEC_BENCH, str(output_dir)], capture_output=True, text=True,
                          timeout=300)


@needs_spec_bench
def test_spec_bench_speed_gives_our_figures(run):
    _, results, out = run
    done = _proof(out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"for {len(results['specbench']['figures'])} (answer file, task) pairs" in done.stdout


@needs_spec_bench
def test_negative_control_a_changed_wall_time_is_a_disagreement(run, tmp_path):
    _, results, out = run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    name = next(f["model_id"] for f in results["specbench"]["answer_files"] if f["row"] == "prompt_lookup")
    answers = _answers(copy, name)
    answers[0]["choices"][0]["wall_time"][0] *= 2
    (copy / "model_answer" / f"{name}.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = _proof(copy)
    assert done.returncode == 1
    assert f"{name} [writing]: tokens per second" in done.stderr
    assert f"{name} [qa]" not in done.stderr                # the other category is untouched


def test_the_proof_says_what_is_missing(tmp_path):
    done = subprocess.run([sys.executable, PROOF, str(tmp_path), str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no " in done.stderr
