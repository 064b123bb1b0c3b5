"""How the bench's identity column classifies a difference (benchmarks/ties.py): exact ties and
near ties of the target's logits are excused in half precision only; every other difference, and
in float32 every difference, is a mismatch and makes `specdec bench` exit 3."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import char_tokenizer, save_bench_family, tiny_model
from specdec.benchmarks.rows import SpecdecRow
from specdec.benchmarks.run import main
from specdec.benchmarks.ties import MISMATCH, NEAR_TIE, TIE, classify, excused, kind_of, ulp

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("value", [1.0, 7.3125, -3.0, 0.15625, 1000.0])
def test_ulp_is_the_spacing_of_the_dtype_at_the_value(dtype, value):
    step = ulp(value, dtype)
    assert torch.tensor(value + step, dtype=dtype).item() == value + step        # the next number up
    assert torch.tensor(value + step / 4, dtype=dtype).item() == value           # nothing in between
    assert ulp(0.0, dtype) == 0.0


def test_ties_near_ties_and_mismatches_on_crafted_logits():
    bf16 = torch.bfloat16
    top = 7.3125                                            # bf16 spacing there: 2 ** -5
    one_below = top - ulp(top, bf16)
    assert kind_of(top, top, top, bf16) == TIE
    assert kind_of(one_below, top, top, bf16) == NEAR_TIE   # ours one unit below the reference's top
    assert kind_of(top, one_below, top, bf16) == NEAR_TIE   # either way round
    assert kind_of(top - 2 * ulp(top, bf16), top, top, bf16) == MISMATCH       # two units: a real gap
    assert kind_of(7.0, 7.0, top, bf16) == MISMATCH         # tied with each other, but neither is the top
    assert kind_of(one_below, top, top, torch.float32) == MISMATCH   # the same gap is many fp32 units


def test_only_half_precision_excuses_ties():
    for dtype in HALF:
        assert excused(TIE, dtype) and excused(NEAR_TIE, dtype) and not excused(MISMATCH, dtype)
    for kind in (TIE, NEAR_TIE, MISMATCH):
        assert not excused(kind, torch.float32)             # fp32 outputs must be token-identical
    top = 7.3125
    assert kind_of(top - ulp(top, torch.float32), top, top, torch.float32) == NEAR_TIE   # classified, not excused


def _tied_model(context: list[int], dtype):
    """A tiny target whose tokens 10 and 11 get the same output row, pointing along the model's last
    hidden state after `context` and longer than every other row: there, the two are the top two
    logits and exactly equal."""
    model = tiny_model("llama", seed=3)
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = model.model(torch.tensor([context])).last_hidden_state[0, -1]           # [H]
        weight = head.weight.detach().clone()                                           # [V, H]
        weight[10] = weight[11] = hidden / hidden.norm() * 10 * weight.norm(dim=1).max()
        head.weight = torch.nn.Parameter(weight)
    return model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_classify_runs_the_target_at_the_first_difference(dtype):
    prompt = [5, 6, 7]
    model = _tied_model(prompt + [20, 21], dtype)
    assert classify(model, prompt, [20, 21, 22], [20, 21, 22]) is None
    tie = classify(model, prompt, [20, 21, 11, 9], [20, 21, 10, 4])
    assert tie["position"] == 2 and tie["kind"] == TIE and (tie["ours"], tie["reference"]) == (11, 10)
    assert tie["logit_ours"] == tie["logit_reference"] == tie["top"]
    assert tie["excused"] is (dtype == torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + [20, 21]])).logits[0, -1].float()       # [V]
    other = int(torch.argsort(logits, descending=True)[5])                          # far below the top
    mismatch = classify(model, prompt, [20, 21, other], [20, 21, 10])
    assert mismatch["kind"] == MISMATCH and not mismatch["excused"]
    assert mismatch["top"] - mismatch["logit_ours"] > mismatch["ulp"]
    shorter = classify(model, prompt, [20, 21], [20, 21, 10])
    assert shorter == {"position": 2, "kind": MISMATCH, "excused": False, "dtype": str(dtype)[6:]}


# ---------------------------------------------------------------------- the bench end to end
BROKEN_ROW, BROKEN_AT = "prompt_lookup", 3


def _break_one_row(monkeypatch, new_token):
    """The prompt_lookup row's greedy output gets `new_token(old)` at new token BROKEN_AT: a row whose
    output really differs from the reference's, whatever the strategy did."""
    generate = SpecdecRow.generate

    def broken(self, prompt_ids, max_new_tokens, temperature, seed):
        out = generate(self, prompt_ids, max_new_tokens, temperature, seed)
        if self.label == BROKEN_ROW and temperature == 0:
            out.token_ids[BROKEN_AT] = new_token(out.token_ids[BROKEN_AT])
        return out

    monkeypatch.setattr(SpecdecRow, "generate", broken)


def _bench(family, out, *extra):
    code = main(["quick", f"models.target={family / 'target'}", "models.draft=null", f"output_dir={out}",
                 "only=[autoregressive,prompt_lookup]", "prompts.sets=[code]", "prompts.num=1", "prompts.tokens=40",
                 "temperatures=[0.0]", "max_new_tokens=8", "warmup_tokens=0", "threads=1", "progress=false", *extra])
    with open(out / "results.json") as fh:
        results = json.load(fh)
    by_row = {r["row"]: r for r in results["records"]}
    return code, results, by_row, (out / "results.md").read_text()


@pytest.fixture(scope="module")
def tiny_family(tmp_path_factory):
    return save_bench_family(tmp_path_factory.mktemp("family"))


@pytest.fixture(scope="module")
def flat_family(tmp_path_factory):
    """A target whose final norm is zero: every logit is exactly 0 after any context, so any token is
    a tie with the argmax (HF's greedy picks id 0)."""
    root = tmp_path_factory.mktemp("flat")
    model = tiny_model("llama", seed=0, layers=2, hidden=32)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    return root


def test_a_row_that_really_differs_is_a_mismatch_and_the_bench_exits_3(tiny_family, tmp_path, monkeypatch):
    _break_one_row(monkeypatch, lambda token: (token + 1) % 96)
    code, results, by_row, tables = _bench(tiny_family, tmp_path / "bench")
    assert code == 3 and results["identity_mismatches"] == 1 and results["identity_excused"] == 0
    broken = by_row[BROKEN_ROW]
    assert broken["identical"] is False and broken["first_mismatch"] == BROKEN_AT
    assert broken["difference"]["kind"] == MISMATCH and broken["difference"]["position"] == BROKEN_AT
    assert broken["difference"]["logit_reference"] == broken["difference"]["top"] > broken["difference"]["logit_ours"]
    assert by_row["autoregressive"]["identical"] is True and by_row["autoregressive"]["difference"] is None
    assert "| `prompt_lookup` |" in tables and "**0/1 MISMATCH**" in tables
    ar_line = next(line for line in tables.splitlines() if line.startswith("| `autoregressive` |"))
    assert ar_line.endswith("| 1/1 |")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_tie_is_excused_in_bf16_and_a_mismatch_in_fp32(flat_family, tmp_path, monkeypatch, dtype):
    _break_one_row(monkeypatch, lambda token: token + 5)        # every logit is 0: any token ties the top
    code, results, by_row, tables = _bench(flat_family, tmp_path / dtype, f"models.dtype={dtype}")
    difference = by_row[BROKEN_ROW]["difference"]
    assert difference["kind"] == TIE and difference["position"] == BROKEN_AT and difference["dtype"] == dtype
    assert by_row["autoregressive"]["identical"] is True
    if dtype == "bfloat16":
        assert code == 0 and difference["excused"]
        assert results["identity_mismatches"] == 0 and results["identity_excused"] == 1
        assert "0/1, 1 tie" in tables and "MISMATCH" not in tables.split("Columns:")[0]
    else:
        assert code == 3 and not difference["excused"]
        assert results["identity_mismatches"] == 1 and "**0/1 MISMATCH**" in tables


@pytest.mark.parametrize("family, dtype, expected", [("tiny_family", "float32", MISMATCH),
                                                     ("flat_family", "bfloat16", TIE),
                                                     ("flat_family", "float32", TIE)])
def test_batch_bench_same_as_ar_classifies_each_prompt(family, dtype, expected, tmp_path, monkeypatch, request):
    """The batch bench's "same as AR": per prompt against our batched autoregressive, the same rule."""
    from specdec.benchmarks import batch
    generate = batch.our_batch_generate

    def broken(row, prompts, max_new_tokens, temperature, seed, batch_size):
        outs = generate(row, prompts, max_new_tokens, temperature, seed, batch_size)
        if row.label == BROKEN_ROW and temperature == 0 and max_new_tokens > BROKEN_AT:
            outs[1][BROKEN_AT] = (outs[1][BROKEN_AT] + 5) % 96          # the second prompt only
        return outs

    monkeypatch.setattr(batch, "our_batch_generate", broken)
    root, out = request.getfixturevalue(family), tmp_path / "batch"
    code = main(["batch", f"models.target={root / 'target'}", "models.draft=null", f"output_dir={out}",
                 "only=[autoregressive,prompt_lookup]", "prompts.sets=[code]", "prompts.num=2", "prompts.tokens=24",
                 "max_new_tokens=6", "batch_sizes=[2]", "temperatures=[0.0]", "warmup_tokens=0", "threads=1",
                 f"models.dtype={dtype}"])
    with open(out / "results.json") as fh:
        by_row = {r["row"]: r for r in json.load(fh)["records"]}
    table = (out / "results.md").read_text()
    assert by_row["autoregressive"]["identical"] is True and by_row["HF generate() batched"]["identical"] is True
    broken_row = by_row[BROKEN_ROW]
    assert broken_row["identical"] is False
    [difference] = broken_row["differences"]
    assert difference["prompt"] == 1 and difference["position"] == BROKEN_AT and difference["kind"] == expected
    if dtype == "bfloat16":
        assert code == 0 and difference["excused"] and "| 1/2, 1 tie |" in table
    else:
        assert code == 3 and not difference["excused"] and "| **1/2 MISMATCH** |" in table


def test_classify_reads_the_logits_as_the_generation_config_processes_them():
    """A repetition penalty on token 10 (in the prompt) breaks its exact tie with token 11: with the
    generation_config both outputs ran with, choosing 10 over 11 is a mismatch, not a tie."""
    from transformers import GenerationConfig
    prompt = [5, 10, 7]
    model = _tied_model(prompt, torch.float32)
    own = model.generation_config
    assert classify(model, prompt, [10], [11])["kind"] == TIE
    penalised = classify(model, prompt, [10], [11], GenerationConfig(repetition_penalty=2.0))
    assert penalised["kind"] == MISMATCH and penalised["logit_reference"] == penalised["top"] > penalised["logit_ours"]
    assert model.generation_config is own                               # the model's own config is put back


def test_a_spec_bench_turn_after_a_tie_keeps_that_tie(flat_family, tmp_path, monkeypatch):
    """On a question file, a turn whose prompt already differs (the row's earlier answer parted from
    the reference's at a tie) is not classified again: it keeps the earlier turn's verdict."""
    _break_one_row(monkeypatch, lambda token: token + 5)        # both turns of the prompt_lookup row
    preset = tmp_path / "preset.yaml"
    preset.write_text("name: ties\nmodels: {device: cpu, dtype: bfloat16}\n"
                      "strategies:\n  - {label: autoregressive, config: autoregressive}\n"
                      "  - {label: prompt_lookup, config: prompt_lookup}\n"
                      "peers:\n  - {label: HF generate(), kind: plain}\n"
                      "temperatures: [0.0]\nmax_new_tokens: 6\nwarmup_tokens: 0\nprogress: false\nthreads: 1\n")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "code", "turns": ["def f(x):\n", "# again\n"]}))
    out = tmp_path / "out"
    code = main([str(preset), f"questions={questions}", f"models.target={flat_family / 'target'}",
                 f"output_dir={out}"])
    with open(out / "results.json") as fh:
        records = {(r["row"], r["turn"]): r for r in json.load(fh)["records"]}
    assert code == 0
    assert records[("autoregressive", 0)]["identical"] and records[("autoregressive", 1)]["identical"]
    first, second = records[(BROKEN_ROW, 0)]["difference"], records[(BROKEN_ROW, 1)]["difference"]
    assert first["kind"] == TIE and first["excused"] and "from_turn" not in first
    assert second["kind"] == TIE and second["excused"] and second["from_turn"] == 0
