"""EAGLE drafter training: the unrolled (training-time test) mask is what tree nodes see at
inference, training raises held-out acceptance, an interrupted run resumes exactly, and two
torchrun processes (gloo, CPU) follow one process's loss trajectory."""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import char_tokenizer, tiny_model
from ddp import torchrun
from eagle_helpers import random_drafter
from specdec.errors import ConfigError
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.eagle_io import load_eagle
from specdec.heads.eagle_train import (CHECKPOINT_FILE, LOG_FILE, Unrolled, is_eagle_config,
                                       load_train_eagle_config, train_eagle, ttt_visible)

SHARPEN = 12.0          # a peaked target: its greedy tokens are learnable in a few steps


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_eagle")
    model = tiny_model("llama", seed=0, sharpen=SHARPEN)
    model.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(6):
        lines = [f"def f{i}_{j}(x, y):\n    return x * {j} + y - {i}\n" for j in range(30)]
        (corpus / f"m{i}.py").write_text("".join(lines))
    return str(root / "target"), str(corpus)


def _cfg(target, corpus, out, **overrides):
    base = {"target": target, "output_dir": out, "corpus": [os.path.join(corpus, f"m{i}.py") for i in range(5)],
            "heldout": [os.path.join(corpus, "m5.py")], "seq_len": 48, "batch_size": 4, "steps": 30,
            "lr": 3e-3, "warmup_steps": 2, "eval_interval": 100, "eval_windows": 4, "eval_new_tokens": 24,
            "eval_depth": 3, "ttt_steps": 2, "checkpoint_interval": 10, "progress": False, "layout": "eagle1"}
    base.update(overrides)
    return load_train_eagle_config(None, base)


def test_unrolled_rows_see_what_tree_nodes_see():
    """Step j, row s: step-1 rows <= s - j + 1 and its own chain (step-i rows s - j + i)."""
    visible = ttt_visible(6, 3, "cpu")[0]                     # [6, 18]
    s = 4
    assert visible[s, :6].tolist() == [True, True, True, False, False, False]       # step 1: rows 0..2
    assert visible[s, 6:12].nonzero().flatten().tolist() == [3]                    # step 2: row s - 1
    assert visible[s, 12:18].nonzero().flatten().tolist() == [4]                   # step 3: itself
    assert ttt_visible(5, 1, "cpu")[0].equal(torch.ones(5, 5, dtype=torch.bool).tril())


def test_unrolled_step_equals_the_strategy_chain():
    """The unrolled pass's step-2 output at row s equals feeding the strategy's tree node (the
    real token at s + 1) on top of the committed rows 0..s - 1: training sees what inference sees."""
    model = tiny_model("llama", seed=0)
    drafter = random_drafter(model, (1, 2))
    drafter.attach_lm_head(model.get_output_embeddings())
    drafter.attach_embedding(model.get_input_embeddings())
    ids = torch.randint(3, 96, (1, 12))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in (1, 2)], -1)
        g = drafter.input_features(feats[:, :-1])
        tokens, rows = ids[:, 1:], 11
        positions = torch.arange(rows)[None]
        out1, _, k1, v1 = drafter(g, tokens, positions, visible=ttt_visible(rows, 1, "cpu"))
        g2 = torch.cat([torch.zeros_like(out1[:, :1]), out1[:, :-1]], 1)
        _, logits2, _, _ = drafter(g2, tokens, positions, k1, v1, ttt_visible(rows, 2, "cpu"))
        s = 7                               # committed rows 0..6, tree node = token s + 1 at position s
        root_out, _, k, v = drafter(g[:, :s], tokens[:, :s], positions[:, :s])
        _, node_logits, _, _ = drafter(root_out[:, -1:], tokens[:, s: s + 1], positions[:, s: s + 1], k, v)
    torch.testing.assert_close(logits2[0, s], node_logits[0, 0], atol=1e-5, rtol=1e-5)


def test_unrolled_loss_targets_are_shifted_to_token_s_plus_2():
    model = tiny_model("llama", seed=0)
    drafter = random_drafter(model)
    drafter.attach_lm_head(model.get_output_embeddings())
    drafter.attach_embedding(model.get_input_embeddings())
    ids = torch.randint(3, 96, (2, 10))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        last = out.hidden_states[-1]
        teacher = torch.randn(2, 10, 96)
        loss, feat, _ = Unrolled(drafter, 2, True)(last, last, teacher, ids)
        _, logits, _, _ = drafter(last[:, :-1], ids[:, 1:], torch.arange(9)[None].expand(2, -1))
        expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), teacher[:, 1:].softmax(-1).flatten(0, 1))
    assert loss[0].item() == pytest.approx(expected.item(), rel=1e-5)
    assert feat.shape == (2,) and (feat > 0).all()


@pytest.mark.parametrize("layout", ["eagle1", pytest.param("eagle3", marks=pytest.mark.slow)])
def test_training_raises_heldout_acceptance(tiny_target, tmp_path, layout):
    target, corpus = tiny_target
    layers = {"feature_layers": [0, 1, 2]} if layout == "eagle3" else {}     # a 2-layer target: distinct ones
    folder = train_eagle(_cfg(target, corpus, str(tmp_path / layout), layout=layout, steps=80, lr=1e-2, **layers))
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    first, last = log["history"][0], log["history"][-1]
    assert (first["step"], last["step"]) == (0, 80) and len(log["losses"]) == 80
    assert all(after < before - 0.5 for before, after in zip(first["step_loss"], last["step_loss"]))
    if layout == "eagle1":          # the tiny random target's greedy tokens are hard to guess: a little
        assert last["acceptance"][0] >= first["acceptance"][0] + 0.05
    drafter = load_eagle(folder, tiny_model("llama", seed=0, sharpen=SHARPEN))
    assert drafter.layout.fused == (layout == "eagle3")
    info = json.load(open(os.path.join(folder, "eagle.json")))
    assert info["training"]["heldout"]["acceptance"] == last["acceptance"]


@pytest.mark.parametrize("layout, output", [("eagle1", "eagle.json"), ("mtp", "mtp.json")])
def test_interrupted_run_resumes_from_its_checkpoint(tiny_target, tmp_path, layout, output):
    target, corpus = tiny_target
    straight = train_eagle(_cfg(target, corpus, str(tmp_path / "straight"), steps=6, checkpoint_interval=3,
                                layout=layout))

    def interrupt(step, metrics):
        if step == 5:
            raise KeyboardInterrupt
    resumed = str(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        train_eagle(_cfg(target, corpus, resumed, steps=6, checkpoint_interval=3, layout=layout), on_step=interrupt)
    assert read_checkpoint(os.path.join(resumed, CHECKPOINT_FILE))["step"] == 5   # saved on the interrupt
    assert not os.path.exists(os.path.join(resumed, output))
    seen = []
    train_eagle(_cfg(target, corpus, resumed, steps=6, checkpoint_interval=3, layout=layout),
                on_step=lambda step, metrics: seen.append(step))
    assert os.path.exists(os.path.join(resumed, output))
    assert seen == [6]
    a = read_checkpoint(os.path.join(straight, CHECKPOINT_FILE))
    b = read_checkpoint(os.path.join(resumed, CHECKPOINT_FILE))
    for name in a["module"]:
        torch.testing.assert_close(a["module"][name], b["module"][name], rtol=0, atol=1e-6)
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-6)


@pytest.mark.slow          # three torchrun launches: about a minute on a busy 2-core machine
def test_two_gloo_processes_follow_the_single_process_losses(tiny_target, tmp_path):
    target, corpus = tiny_target
    args = [f"target={target}", f"corpus=[{','.join(os.path.join(corpus, f'm{i}.py') for i in range(5))}]",
            f"heldout=[{os.path.join(corpus, 'm5.py')}]", "seq_len=48", "batch_size=4", "steps=4", "lr=3e-3",
            "warmup_steps=2", "eval_interval=100", "eval_windows=2", "eval_new_tokens=24", "eval_depth=2",
            "ttt_steps=2", "checkpoint_interval=100", "progress=false", "layout=eagle3", "feature_layers=[0,1,2]",
            "backend=gloo"]
    runs = {}
    for procs in (1, 2):
        out = str(tmp_path / f"p{procs}")
        torchrun("specdec.heads.eagle_train", args, procs, out, port=29500)
        runs[procs] = json.load(open(os.path.join(out, LOG_FILE)))
    assert runs[2]["processes"] == 2 and runs[1]["processes"] == 1
    assert len(runs[1]["losses"]) == 4
    assert runs[2]["losses"] == pytest.approx(runs[1]["losses"], rel=1e-4)
    assert runs[2]["losses"][-1] != runs[2]["losses"][0]


def test_config_errors_and_dispatch():
    with pytest.raises(ConfigError, match="valid keys"):
        load_train_eagle_config(None, ["target=x", "stepz=3"])
    with pytest.raises(ConfigError, match="no target"):
        load_train_eagle_config(None, ["steps=3"])
    with pytest.raises(ConfigError, match="layout"):
        load_train_eagle_config(None, ["target=x", "layout=eagle9"])
    cfg = load_train_eagle_config("train_eagle", ["steps=7", "target=x"])   # shipped with target: null
    assert cfg.steps == 7 and cfg.output_dir == "../eagle-pycode"
    shipped = load_train_eagle_config("train_eagle", ["target=x"])
    assert shipped.max_minutes is None and shipped.steps == 3000 and shipped.seed == 0   # the same weights everywhere
    assert is_eagle_config("train_eagle") and not is_eagle_config("train_heads")


def test_time_budget_ends_the_run_with_a_saved_drafter(tiny_target, tmp_path):
    target, corpus = tiny_target
    folder = train_eagle(_cfg(target, corpus, str(tmp_path / "timed"), steps=1000, max_minutes=1e-4))
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    assert len(log["losses"]) < 1000 and log["history"][-1]["step"] == len(log["losses"])
    assert os.path.isfile(os.path.join(folder, "eagle.json"))
    with pytest.raises(ConfigError, match="max_minutes"):
        _cfg(target, corpus, str(tmp_path / "x"), max_minutes=0)


def test_a_time_budget_that_cuts_training_short_says_so(tiny_target, tmp_path, capsys):
    """max_minutes is an opt-in guard: when it stops a run before its steps, the run says so and its log
    records it; a run that does all its steps records that it was not cut."""
    import json
    target, corpus = tiny_target
    cut = str(tmp_path / "cut")
    train_eagle(_cfg(target, corpus, cut, steps=30, max_minutes=1e-9))
    log = json.load(open(os.path.join(cut, "eagle_train.json")))
    assert log["stopped_by_max_minutes"] is True and log["steps_done"] < 30
    shown = capsys.readouterr()
    assert "stopped by max_minutes" in shown.out + shown.err
    whole = str(tmp_path / "whole")
    train_eagle(_cfg(target, corpus, whole, steps=3))
    log = json.load(open(os.path.join(whole, "eagle_train.json")))
    assert log["stopped_by_max_minutes"] is False and log["steps_done"] == 3


def test_eagle3_layers_are_distinct_where_the_target_has_them(tiny_target, tmp_path):
    """speculators refuses repeated target layers: from 4 decoder layers up the default fused layers
    are distinct (EAGLE-3's 2, L/2, L - 3 where those are), and a training run that would repeat one
    is refused with a message saying what to give."""
    from specdec.heads.eagle import eagle3_layers
    assert eagle3_layers(32) == (2, 16, 29) and eagle3_layers(8) == (2, 4, 5)
    for count in range(4, 40):
        layers = eagle3_layers(count)
        assert len(set(layers)) == 3 and all(1 <= i <= count for i in layers), (count, layers)
    target, corpus = tiny_target                                           # 2 decoder layers
    with pytest.raises(ConfigError, match="repeats one"):
        train_eagle(_cfg(target, corpus, str(tmp_path / "e3"), layout="eagle3", steps=2))


def test_eagle31_normalisation_is_a_training_setting(tiny_target, tmp_path):
    """EAGLE 3.1's norm before fc and normalised feedback are set by the trainer's config, reach the
    saved drafter and load back; on an EAGLE-1 layout they are refused."""
    target, corpus = tiny_target
    folder = train_eagle(_cfg(target, corpus, str(tmp_path / "e31"), layout="eagle3", feature_layers=[0, 1, 2],
                              steps=2, norm_before_fc=True, norm_output=True))
    drafter = load_eagle(folder, tiny_model("llama", seed=0, sharpen=SHARPEN))
    assert drafter.layout.norm_before_fc and drafter.layout.norm_output
    with pytest.raises(ConfigError, match="layout=eagle3"):
        _cfg(target, corpus, str(tmp_path / "e1"), layout="eagle1", norm_output=True)


def test_the_shipped_eagle3_config_loads_validates_and_trains(tiny_target, tmp_path):
    """configs/train_eagle3.yaml (the A/B's winner, benchmarks/results/eagle3/README.md: EAGLE 3.1's
    normalisation, training-time test 2 steps, the target's MLP width) loads and validates as an EAGLE training config, gives
    that recipe, and trains: two steps on a tiny target (its 2 layers given as distinct fused layers)
    save a drafter that loads back with the normalisation."""
    assert is_eagle_config("train_eagle3")
    cfg = load_train_eagle_config("train_eagle3", ["target=x"])          # shipped with target: null
    assert cfg.layout == "eagle3" and cfg.ttt_steps == 2 and cfg.step_loss_decay == 0.8
    assert cfg.norm_before_fc and cfg.norm_output and not cfg.norm_before_residual
    assert cfg.intermediate_size is None and cfg.draft_vocab_size is None     # None: the target's width
    assert cfg.steps == 1500 and cfg.seed == 0 and cfg.max_minutes is None   # the same weights everywhere
    target, corpus = tiny_target
    tiny = {"target": target, "output_dir": str(tmp_path / "e3"), "corpus": [os.path.join(corpus, "m0.py")],
            "heldout": [os.path.join(corpus, "m5.py")], "feature_layers": [0, 1, 2], "intermediate_size": 32,
            "seq_len": 24, "steps": 2, "eval_windows": 2, "eval_new_tokens": 8, "eval_depth": 2,
            "progress": False}
    folder = train_eagle(load_train_eagle_config("train_eagle3", tiny))
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    assert log["config"]["ttt_steps"] == 2 and log["steps_done"] == 2
    drafter = load_eagle(folder, tiny_model("llama", seed=0, sharpen=SHARPEN))
    assert drafter.layout.norm_before_fc and drafter.layout.norm_output
