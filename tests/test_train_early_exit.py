"""`specdec train early-exit`: the curriculum, the exit weights and the layer-dropout rates are the ones
written out by hand; a dropped layer passes its input by for that row only; an exit's training logits
are what early_exit drafts with; a run writes a loadable Hugging Face target that early_exit drafts
from with greedy identity; an interrupted run resumes bit-exactly; the same config and seed make
the same weights; a checkpoint of another trainer or for another target is refused."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import char_tokenizer, hf_greedy, tiny_model
from ddp import torchrun
from zoo import stop_at
from specdec.api import Speculator
from specdec.cli import main as cli_main
from specdec.errors import ConfigError
from specdec.heads.checkpoint import read_checkpoint, save_checkpoint
from specdec.heads.early_exit_train import (CHECKPOINT_FILE, INFO_FILE, LOG_FILE, TARGET_FOLDER, Exits,
                                            TrainEarlyExitConfig, load_train_early_exit_config, train_early_exit)
from specdec.heads.layerskip import dropout_rates, exit_weights, exits_at, keep_mask, layer_hooks
from specdec.strategies.early_exit import EarlyExit, exit_view

LAYERS = 4


# ---------------------------------------------------------------------- the schedule, by hand
def test_the_rotational_curriculum_moves_one_exit_deeper_each_step_and_keeps_the_last():
    assert [exits_at(step, 4, "rotational", 2) for step in range(4)] == [[1, 3, 4], [2, 4], [1, 3, 4], [2, 4]]
    assert [exits_at(step, 8, "rotational", 3) for step in range(4)] == \
        [[1, 4, 7, 8], [2, 5, 8], [3, 6, 8], [1, 4, 7, 8]]
    assert exits_at(5, 8, "rotational", 1) == [1, 2, 3, 4, 5, 6, 7, 8]
    for step in range(12):                          # each early exit once every R steps
        assert sum(3 in exits_at(s, 8, "rotational", 4) for s in range(step, step + 4)) == 1


def test_the_gradual_curriculum_switches_exits_on_from_the_deepest_down():
    # L = 4, 12 steps: exit E from step (4 - E) / 3 * 12 / 2 = 2 (E = 3), 4 (E = 2), 6 (E = 1)
    got = {step: exits_at(step, 4, "gradual", steps=12) for step in (0, 1, 2, 3, 4, 5, 6, 11)}
    assert got == {0: [4], 1: [4], 2: [3, 4], 3: [3, 4], 4: [2, 3, 4], 5: [2, 3, 4], 6: [1, 2, 3, 4],
                   11: [1, 2, 3, 4]}
    assert exits_at(0, 4, "none") == [1, 2, 3, 4]


def test_exit_weights_are_normalised_and_scale_the_early_exits_only():
    assert exit_weights([1, 3, 8], 8, "sum_l", 1.0) == pytest.approx({1: 1 / 43, 3: 6 / 43, 8: 36 / 43})
    assert exit_weights([1, 3, 8], 8, "sum_l", 0.5) == pytest.approx({1: 0.5 / 39.5, 3: 3 / 39.5, 8: 36 / 39.5})
    assert exit_weights([2, 4], 4, "l", 1.0) == pytest.approx({2: 2 / 6, 4: 4 / 6})
    assert exit_weights([1, 2, 4], 4, "one", 2.0) == pytest.approx({1: 0.4, 2: 0.4, 4: 0.2})
    assert exit_weights([4], 4, "sum_l", 0.0) == {4: 1.0}


def test_dropout_rates_rise_from_zero_to_p_max():
    assert dropout_rates(3, 0.2, "linear") == pytest.approx([0.0, 0.1, 0.2])
    assert dropout_rates(3, 0.2, "exp") == pytest.approx([0.0, 0.2 * (math.sqrt(2) - 1), 0.2])
    assert dropout_rates(5, 0.0, "exp") == [0.0] * 5


def test_the_keep_mask_drops_each_layer_at_its_rate():
    rates = [0.0, 0.25, 0.5]
    keep = keep_mask(rates, 4000, torch.Generator().manual_seed(0))            # [3, 4000]
    assert keep.shape == (3, 4000) and bool(keep[0].all())
    for rate, row in zip(rates[1:], keep[1:]):
        dropped = 1 - row.float().mean().item()
        assert abs(dropped - rate) < 4 * math.sqrt(rate * (1 - rate) / 4000)
    again = keep_mask(rates, 4000, torch.Generator().manual_seed(0))
    assert torch.equal(keep, again)


# ---------------------------------------------------------------------- the exits and the dropout in a forward
@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0, layers=LAYERS, sharpen=3.0)


def test_a_dropped_layer_passes_its_input_by_for_that_row_only(model):
    exits = Exits(model)
    ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    with layer_hooks(exits.layers, None, {}) as plain:
        full = model(input_ids=ids).logits
    keep = torch.ones(LAYERS, 2, dtype=torch.bool)
    keep[2, 0] = False                                  # layer 2 skipped for row 0
    with layer_hooks(exits.layers, keep, {}) as dropped:
        logits = model(input_ids=ids).logits
    assert torch.equal(dropped[2][0], dropped[1][0])    # row 0: layer 2's output is its input
    assert not torch.allclose(dropped[2][1], dropped[1][1])
    assert torch.equal(dropped[2][1], plain[2][1])      # row 1 runs every layer, as without the hooks
    assert torch.equal(logits[1], full[1]) and not torch.allclose(logits[0], full[0])
    assert torch.equal(full, model(input_ids=ids).logits)   # the hooks are gone, and changed nothing


@pytest.mark.parametrize("exit_layer", range(1, LAYERS))
def test_an_exits_training_logits_are_what_early_exit_drafts_with(model, exit_layer):
    exits = Exits(model)
    ids = torch.randint(3, 60, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), layer_hooks(exits.layers, None, {}) as outputs:
        model(input_ids=ids)
        trained = exits.logits(outputs[exit_layer - 1])
        drafted = exit_view(model, exit_layer)(input_ids=ids).logits
    torch.testing.assert_close(trained, drafted, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- training on a tiny target
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_early_exit")
    tiny_model("llama", seed=0, layers=LAYERS, sharpen=3.0).save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    tiny_model("llama", seed=7, layers=LAYERS, sharpen=3.0).save_pretrained(root / "other")
    char_tokenizer().save_pretrained(root / "other")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x, y):\n    return x * {j} + y - {i}\n"
                                                 for j in range(30)))
    return {"target": str(root / "target"), "other": str(root / "other"), "corpus": str(corpus)}


def _cfg(tiny, out, **overrides):
    base = {"target": tiny["target"], "output_dir": str(out),
            "corpus": [os.path.join(tiny["corpus"], f"m{i}.py") for i in range(3)],
            "heldout": [os.path.join(tiny["corpus"], "m3.py")], "layer_dropout_max": 0.5,
            "seq_len": 32, "batch_size": 4, "steps": 6, "lr": 3e-3, "warmup_steps": 1, "eval_interval": 100,
            "eval_windows": 4, "checkpoint_interval": 100, "bf16": False, "progress": False}
    base.update(overrides)
    return load_train_early_exit_config(None, base)


def weights_of(folder) -> dict:
    return load_file(os.path.join(folder, TARGET_FOLDER, "model.safetensors"))


def test_training_writes_a_plain_hf_target_that_early_exit_drafts_from_with_greedy_identity(tiny, tmp_path):
    seen = []
    folder = train_early_exit(_cfg(tiny, tmp_path / "out", steps=20, eval_interval=10),
                              on_step=lambda step, metrics: seen.append(metrics))
    assert [m["exits"] for m in seen[:2]] == [[1, 3, 4], [2, 4]]     # the shipped curriculum, rotation 2
    assert sum(m["dropped"] for m in seen) > 0
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    first, last = log["history"][0], log["history"][-1]
    assert [h["step"] for h in log["history"]] == [0, 10, 20]
    assert len(first["loss"]) == LAYERS and len(first["match"]) == LAYERS - 1
    assert last["loss"][0] < first["loss"][0]           # the first exit learnt to guess the next token
    written = os.path.join(folder, TARGET_FOLDER)
    assert sorted(n for n in os.listdir(os.path.dirname(written)) if n.startswith(".")) == []   # no temp left
    info = json.load(open(os.path.join(written, INFO_FILE)))
    assert info["recipe"]["steps"] == 20 and info["fine_tuned_from"]["path"] == os.path.abspath(tiny["target"])
    tuned = AutoModelForCausalLM.from_pretrained(written).eval()
    tokenizer = AutoTokenizer.from_pretrained(written)
    original = AutoModelForCausalLM.from_pretrained(tiny["target"])
    assert not torch.equal(tuned.model.layers[0].mlp.up_proj.weight, original.model.layers[0].mlp.up_proj.weight)
    prompt = tokenizer("def f0_3(x, y):\n    return", add_special_tokens=False)["input_ids"]
    want = hf_greedy(tuned, prompt, 24)
    for exit_layer in range(1, LAYERS):
        out = Speculator(tuned, tokenizer, EarlyExit(exit_layer, num_tokens=3)).generate(
            prompt, max_new_tokens=24, ignore_eos=True)
        assert out.token_ids == want[: len(out.token_ids)] and len(out.token_ids) == 24, exit_layer


def test_only_the_layers_train_when_asked(tiny, tmp_path):
    folder = train_early_exit(_cfg(tiny, tmp_path / "layers", steps=3, trainable="layers"))
    tuned, original = weights_of(folder), load_file(os.path.join(tiny["target"], "model.safetensors"))
    assert torch.equal(tuned["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert torch.equal(tuned["model.norm.weight"], original["model.norm.weight"])
    assert not torch.equal(tuned["model.layers.1.self_attn.q_proj.weight"],
                           original["model.layers.1.self_attn.q_proj.weight"])


def test_the_same_config_and_seed_make_the_same_weights(tiny, tmp_path):
    a = weights_of(train_early_exit(_cfg(tiny, tmp_path / "a", steps=4)))
    b = weights_of(train_early_exit(_cfg(tiny, tmp_path / "b", steps=4)))
    c = weights_of(train_early_exit(_cfg(tiny, tmp_path / "c", steps=4, seed=1)))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert any(not torch.equal(a[name], c[name]) for name in a)     # the seed is what they share


def test_interrupted_runs_resume_bit_exactly(tiny, tmp_path):
    """Ctrl-C (the checkpoint of the last finished step is written) and a crash (the last periodic
    checkpoint is what is left) both resume to the uninterrupted run's losses and weights."""
    straight = train_early_exit(_cfg(tiny, tmp_path / "straight"))

    sigint, killed = tmp_path / "sigint", tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train_early_exit(_cfg(tiny, sigint), on_step=stop_at(4, KeyboardInterrupt()))
    assert read_checkpoint(sigint / CHECKPOINT_FILE)["step"] == 4
    assert not (sigint / TARGET_FOLDER).exists()
    with pytest.raises(RuntimeError):
        train_early_exit(_cfg(tiny, killed, checkpoint_interval=3), on_step=stop_at(5, RuntimeError("killed")))
    assert read_checkpoint(killed / CHECKPOINT_FILE)["step"] == 3
    a = read_checkpoint(os.path.join(straight, CHECKPOINT_FILE))
    for folder in (sigint, killed):
        seen = []
        train_early_exit(_cfg(tiny, folder), on_step=lambda step, m: seen.append(step))
        assert seen == ([5, 6] if folder == sigint else [4, 5, 6])
        b = read_checkpoint(folder / CHECKPOINT_FILE)
        assert b["losses"] == a["losses"]
        for name in a["module"]:
            assert torch.equal(a["module"][name], b["module"][name]), name
        assert weights_of(folder).keys() == weights_of(straight).keys()
        for name, value in weights_of(folder).items():
            assert torch.equal(value, weights_of(straight)[name]), name


def test_a_checkpoint_of_another_trainer_or_for_another_target_is_refused(tiny, tmp_path):
    other_target = tmp_path / "other_target"
    train_early_exit(_cfg(tiny, other_target, steps=1, target=tiny["other"]))
    with pytest.raises(ConfigError, match="for the target .*other.* whose weights differ"):
        train_early_exit(_cfg(tiny, other_target, steps=2))
    medusa = tmp_path / "medusa"
    module = torch.nn.Linear(2, 2)
    save_checkpoint(str(medusa / CHECKPOINT_FILE), "medusa", module, torch.optim.AdamW(module.parameters()),
                    torch.Generator(), {}, None, step=1, history=[], losses=[])
    with pytest.raises(ConfigError, match="Medusa heads .* but this run trains a target fine-tuned for early exit"):
        train_early_exit(_cfg(tiny, medusa, steps=2))


def test_config_errors_help_and_the_shipped_config(tiny, capsys):
    with pytest.raises(ConfigError, match="no target given"):
        load_train_early_exit_config(None, {})
    with pytest.raises(ConfigError, match="below 1"):
        _cfg(tiny, "x", layer_dropout_max=1.0)
    with pytest.raises(ConfigError):
        _cfg(tiny, "x", early_exit_curriculum="spiral")
    assert cli_main(["train", "early-exit", "train_early_exit", "--help"]) == 0
    out = capsys.readouterr().out
    keys = [line.split("=")[0].strip() for line in out.splitlines() if line.startswith("  ") and " = " in line]
    import dataclasses
    assert keys == [f.name for f in dataclasses.fields(TrainEarlyExitConfig)]
    assert "early_exit_rotation" in out and "layer_dropout_max" in out
    shipped = load_train_early_exit_config("train_early_exit", {"target": tiny["target"]})
    assert shipped.steps > 0 and shipped.seed == 0 and shipped.max_minutes is None
    assert not os.path.isabs(shipped.output_dir) and ".." not in shipped.output_dir


def test_the_command_line_trains_and_says_where_the_target_is(tiny, tmp_path, capsys):
    corpus = tiny["corpus"]
    out = str(tmp_path / "cli")
    assert cli_main(["train", "early-exit", f"target={tiny['target']}", f"output_dir={out}",
                     f"corpus=[{os.path.join(corpus, 'm0.py')}]", f"heldout=[{os.path.join(corpus, 'm3.py')}]",
                     "seq_len=24", "batch_size=2", "steps=2", "warmup_steps=1", "eval_windows=2", "bf16=false",
                     "progress=false"]) == 0
    assert f"specdec generate early_exit target.path={os.path.join(out, TARGET_FOLDER)}" in capsys.readouterr().out
    assert read_checkpoint(os.path.join(out, CHECKPOINT_FILE))["kind"] == "early_exit"


@pytest.mark.slow          # three torchrun launches: about a minute on a busy 2-core machine
def test_two_gloo_processes_make_the_single_process_first_update(tiny, tmp_path):
    """Through the one training loop's DDP: each process takes its share of the batch, and the update is the one
    a single process makes (no layer dropout: its draws are per process)."""
    args = [f"target={tiny['target']}", f"corpus=[{','.join(os.path.join(tiny['corpus'], f'm{i}.py') for i in range(3))}]",
            f"heldout=[{os.path.join(tiny['corpus'], 'm3.py')}]", "layer_dropout_max=0.0", "seq_len=32",
            "batch_size=4", "steps=1", "lr=1e-2", "warmup_steps=1", "eval_interval=100", "eval_windows=2",
            "checkpoint_interval=100", "bf16=false", "progress=false", "backend=gloo"]
    weights = {}
    for procs in (1, 2):
        out = str(tmp_path / f"p{procs}")
        torchrun("specdec.heads.early_exit_train", args, procs, out, port=29700)
        assert json.load(open(os.path.join(out, LOG_FILE)))["processes"] == procs
        weights[procs] = weights_of(out)
    start = load_file(os.path.join(tiny["target"], "model.safetensors"))
    assert any(not torch.equal(weights[1][k], start[k]) for k in start)     # the step changed the target...
    assert weights[2].keys() == weights[1].keys()
    for name in weights[1]:                                                 # ...and the two processes alike
        torch.testing.assert_close(weights[2][name], weights[1][name], rtol=1e-5, atol=1e-6)
