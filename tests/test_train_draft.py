"""`specdec train-draft`: each divergence is its closed form (zero exactly at p = q), gradients reach
the draft only, on-policy batches are the draft's own samples, an interrupted run resumes
bit-exactly, a few steps lower the held-out TV, the output is a plain Hugging Face checkpoint that
draft_model and HF's assistant_model= take, and two gloo processes make one process's first update."""
from __future__ import annotations

import json
import math
import os
import warnings

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import specdec
from conftest import char_tokenizer, tiny_model
from ddp import torchrun
from zoo import stop_at
from specdec.cli import main as cli_main
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.heads import distill, loop
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.distill import CHECKPOINT_FILE, INFO_FILE, LOG_FILE, load_train_draft_config, train_draft
from specdec.heads.distill_loss import (LOG_FLOOR, distill_loss, divergence, loss_weights, target_log_probs)

SHARPEN = 8.0           # a peaked target, as trained models are: its distributions are learnable in a few steps


# ---------------------------------------------------------------------- the losses, on hand-made distributions
P = [0.5, 0.3, 0.2]
Q = [0.2, 0.2, 0.6]


def logs(probs):
    return torch.tensor([probs], dtype=torch.float64).log()


def kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)


def test_each_divergence_is_its_closed_form():
    p, q = logs(P), logs(Q)
    assert divergence("fkl", p, q).item() == pytest.approx(kl(P, Q), rel=1e-12)
    assert divergence("rkl", p, q).item() == pytest.approx(kl(Q, P), rel=1e-12)
    assert divergence("tvd", p, q).item() == pytest.approx(0.5 * sum(abs(a - b) for a, b in zip(P, Q)), rel=1e-12)
    for beta in (0.5, 0.1, 0.9):
        m = [beta * a + (1 - beta) * b for a, b in zip(P, Q)]
        want = beta * kl(P, m) + (1 - beta) * kl(Q, m)
        assert divergence("jsd", p, q, beta).item() == pytest.approx(want, rel=1e-10)
    assert divergence("jsd", p, q, 0.5).item() <= math.log(2)


def test_filtered_target_zero_probability_terms():
    """Where the target's filter removed a token (p = 0): fkl's term is 0, rkl reads log p as
    LOG_FLOOR, jsd and tvd stay finite closed forms."""
    p_probs = [0.6, 0.4, 0.0]
    p = torch.tensor([[math.log(0.6), math.log(0.4), float("-inf")]], dtype=torch.float64)
    q = logs(Q)
    assert divergence("fkl", p, q).item() == pytest.approx(kl(p_probs, Q), rel=1e-12)
    want_rkl = sum(b * (math.log(b) - (math.log(a) if a > 0 else LOG_FLOOR)) for a, b in zip(p_probs, Q))
    assert divergence("rkl", p, q).item() == pytest.approx(want_rkl, rel=1e-12)
    assert divergence("tvd", p, q).item() == pytest.approx(0.5 * sum(abs(a - b) for a, b in zip(p_probs, Q)))
    m = [0.5 * a + 0.5 * b for a, b in zip(p_probs, Q)]
    assert divergence("jsd", p, q).item() == pytest.approx(0.5 * kl(p_probs, m) + 0.5 * kl(Q, m), rel=1e-10)


@pytest.mark.parametrize("name", ["fkl", "rkl", "jsd", "tvd"])
def test_zero_exactly_at_p_equal_q_and_positive_elsewhere(name):
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    same = torch.log_softmax(logits, -1)
    value = divergence(name, same, same.clone()).item()
    if name == "jsd":        # log m = logsumexp(log b + l, log(1 - b) + l) rounds to l within an ulp
        assert abs(value) < 1e-12
    else:
        assert value == 0.0
    other = torch.log_softmax(logits.flip(-1), -1)
    assert divergence(name, same, other).item() > 1e-3


def test_the_target_distribution_is_the_one_sampled_from():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    greedy = target_log_probs(logits, 0.0).exp()
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0]]                       # the argmax's point mass
    hot = target_log_probs(logits, 0.5).exp()
    torch.testing.assert_close(hot, torch.softmax(logits / 0.5, -1))
    top2 = target_log_probs(logits, 1.0, top_k=2).exp()
    torch.testing.assert_close(top2[0, :2], torch.softmax(logits[0, :2], -1))
    assert top2[0, 2:].tolist() == [0.0, 0.0]
    # greedy: the forward KL is the cross-entropy on the target's argmax, the TVD 1 - q(argmax)
    draft_logits = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    q = torch.softmax(draft_logits, -1)[0]
    fkl, _ = distill_loss({"fkl": 1.0}, logits, draft_logits, None, temperature=0.0)
    tvd, _ = distill_loss({"tvd": 1.0}, logits, draft_logits, None, temperature=0.0)
    assert fkl.item() == pytest.approx(-math.log(q[0].item()), rel=1e-6)
    assert tvd.item() == pytest.approx(1 - q[0].item(), rel=1e-6)


def test_a_mix_is_the_weighted_sum_and_ce_reads_the_labels():
    target_logits, draft_logits = torch.randn(6, 9), torch.randn(6, 9)
    labels = torch.randint(0, 9, (6,))
    total, parts = distill_loss({"rkl": 0.9, "ce": 0.1}, target_logits, draft_logits, labels)
    ce = torch.nn.functional.cross_entropy(draft_logits, labels).item()
    assert parts["ce"] == pytest.approx(ce, rel=1e-6)
    assert total.item() == pytest.approx(0.9 * parts["rkl"] + 0.1 * ce, rel=1e-6)
    assert loss_weights({"rkl": 0.9, "ce": 0.1}) == {"rkl": 0.9, "ce": 0.1}
    for bad, match in (("kl", "unknown loss"), ({"ce": 1.0}, "mix it"), ({"rkl": -1}, ">= 0"), (3, "a name")):
        with pytest.raises(ConfigError, match=match):
            loss_weights(bad)


# ---------------------------------------------------------------------- training on a tiny target
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_distill")
    tiny_model("llama", seed=0, sharpen=SHARPEN).save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    tiny_model("llama", seed=5, layers=1, hidden=16).save_pretrained(root / "draft")
    char_tokenizer().save_pretrained(root / "draft")
    tiny_model("llama", seed=6, layers=1, hidden=16).save_pretrained(root / "foreign")
    char_tokenizer(reverse=True).save_pretrained(root / "foreign")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x, y):\n    return x * {j} + y - {i}\n"
                                                 for j in range(30)))
    return {"target": str(root / "target"), "draft": str(root / "draft"), "foreign": str(root / "foreign"),
            "corpus": str(corpus)}


def _cfg(tiny, out, **overrides):
    base = {"target": tiny["target"], "draft": None, "output_dir": str(out),
            "corpus": [os.path.join(tiny["corpus"], f"m{i}.py") for i in range(3)],
            "heldout": [os.path.join(tiny["corpus"], "m3.py")],
            "draft_config": {"hidden_size": 16, "num_layers": 1, "num_heads": 2},
            "seq_len": 32, "batch_size": 4, "steps": 6, "lr": 1e-2, "warmup_steps": 1, "eval_interval": 100,
            "eval_windows": 4, "eval_prompts": 2, "eval_prompt_tokens": 8, "eval_new_tokens": 8,
            "prompt_tokens": 8, "checkpoint_interval": 100, "progress": False}
    base.update(overrides)
    return load_train_draft_config(None, base)


def test_gradients_reach_the_draft_only(tiny, tmp_path, monkeypatch):
    loaded = {}
    real_load_model, real_load_draft = distill.load_model, distill.load_draft

    def load_model(path, role, *args, **kwargs):
        model = real_load_model(path, role, *args, **kwargs)
        loaded[role] = model
        return model

    def load_draft(*args, **kwargs):
        loaded["draft"] = real_load_draft(*args, **kwargs)
        loaded["draft_start"] = {k: v.clone() for k, v in loaded["draft"].state_dict().items()}
        return loaded["draft"]
    monkeypatch.setattr(loop, "load_model", load_model)           # the target: loaded by the one loop
    monkeypatch.setattr(distill, "load_draft", load_draft)
    target_before = load_file(os.path.join(tiny["target"], "model.safetensors"))
    train_draft(_cfg(tiny, tmp_path / "out", steps=2, eval_prompts=0))
    target = loaded["target"]
    assert all(not p.requires_grad and p.grad is None for p in target.parameters())
    for name, tensor in target.state_dict().items():
        if name in target_before:
            assert torch.equal(tensor, target_before[name])
    draft = loaded["draft"]
    assert all(p.grad is not None for p in draft.parameters() if p.requires_grad)
    assert any(not torch.equal(v, loaded["draft_start"][k]) for k, v in draft.state_dict().items())


@pytest.mark.parametrize("data,mix_lambda,expected", [("draft", 0.5, 3), ("mixed", 1.0, 3), ("mixed", 0.0, 0),
                                                      ("fixed", 0.5, 0)])
def test_on_policy_batches_are_the_drafts_own_samples(tiny, tmp_path, monkeypatch, data, mix_lambda, expected):
    drafts, calls, batches = [], [], []
    real_load_draft, real_sample = distill.load_draft, distill.sample_continuations
    monkeypatch.setattr(distill, "load_draft", lambda *a, **k: drafts.append(real_load_draft(*a, **k)) or drafts[-1])

    def sample(model, prompts, new_tokens, temperature, generator):
        out = real_sample(model, prompts, new_tokens, temperature, generator)
        calls.append((model, prompts.clone(), out.clone()))
        return out
    monkeypatch.setattr(distill, "sample_continuations", sample)
    monkeypatch.setattr(distill, "target_continuations", lambda *a, **k: pytest.fail("the target generated"))
    real_make_batch = distill.make_batch
    monkeypatch.setattr(distill, "make_batch", lambda *a, **k: batches.append(real_make_batch(*a, **k)) or batches[-1])
    train_draft(_cfg(tiny, tmp_path / "out", steps=3, eval_prompts=0, data=data, mix_lambda=mix_lambda))
    assert len(calls) == expected
    for (model, prompts, out), (ids, first) in zip(calls, batches):
        assert model is drafts[0]                                  # the draft being trained, not the target
        assert out.shape == (4, 32) and torch.equal(out[:, :8], prompts)
        assert torch.equal(ids, out) and first == 7                # the step trained on exactly those samples
    if expected == 0:
        assert all(first == 0 for _, first in batches)


def test_sampling_is_the_models_own_distribution():
    """sample_continuations draws each token from the model's softmax: on a peaked model the
    empirical frequencies of 2000 draws are within sampling noise of its probabilities."""
    model = tiny_model("llama", seed=3, sharpen=20.0)
    prompt = torch.tensor([[5, 6, 7]]).repeat(2000, 1)
    out = distill.sample_continuations(model, prompt, 1, 1.0, torch.Generator().manual_seed(0))
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=prompt[:1]).logits[0, -1], -1)
    counts = torch.bincount(out[:, -1], minlength=probs.numel()).float() / 2000
    assert 0.5 * (counts - probs).abs().sum().item() < 0.08
    uniform = torch.full_like(probs, 1 / probs.numel())             # the check has power: another law fails it
    assert 0.5 * (counts - uniform).abs().sum().item() > 0.3


def test_interrupted_runs_resume_bit_exactly(tiny, tmp_path):
    """Ctrl-C (a KeyboardInterrupt: the checkpoint of the last finished step is written) and kill -9
    (nothing written after the last periodic checkpoint) both resume to the uninterrupted run's
    losses and weights; on-policy data, so the per-step sampling is exercised too."""
    straight = train_draft(_cfg(tiny, tmp_path / "straight", data="draft", steps=6))

    sigint, killed = tmp_path / "sigint", tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train_draft(_cfg(tiny, sigint, data="draft", steps=6), on_step=stop_at(4, KeyboardInterrupt()))
    assert read_checkpoint(sigint / CHECKPOINT_FILE)["step"] == 4
    assert not (sigint / INFO_FILE).exists()
    with pytest.raises(RuntimeError):                     # dies at step 5: the step-3 checkpoint is what is left
        train_draft(_cfg(tiny, killed, data="draft", steps=6, checkpoint_interval=3),
                    on_step=stop_at(5, RuntimeError("killed")))
    assert read_checkpoint(killed / CHECKPOINT_FILE)["step"] == 3
    a = read_checkpoint(os.path.join(straight, CHECKPOINT_FILE))
    for folder in (sigint, killed):
        seen = []
        train_draft(_cfg(tiny, folder, data="draft", steps=6), on_step=lambda step, m: seen.append(step))
        assert seen == ([5, 6] if folder == sigint else [4, 5, 6])
        b = read_checkpoint(folder / CHECKPOINT_FILE)
        assert b["losses"] == a["losses"]
        for name in a["module"]:
            assert torch.equal(a["module"][name], b["module"][name]), name


def test_a_few_steps_lower_the_heldout_tv_and_write_a_plain_hf_checkpoint(tiny, tmp_path):
    folder = train_draft(_cfg(tiny, tmp_path / "out", steps=30, eval_interval=15, loss={"rkl": 0.9, "ce": 0.1}))
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    first, last = log["history"][0], log["history"][-1]
    assert (first["step"], last["step"]) == (0, 30) and len(log["losses"]) == 30
    assert last["acceptance_t1"] > first["acceptance_t1"] + 0.05          # 1 - TV rose: TV fell
    assert last["train_time_s"] > 0 and {"tau_greedy", "tau_t0.8"} <= set(last)
    draft = AutoModelForCausalLM.from_pretrained(folder)                   # plain Hugging Face checkpoint
    assert draft.config.hidden_size == 16
    info = json.load(open(os.path.join(folder, INFO_FILE)))
    assert info["target"]["path"] == os.path.abspath(tiny["target"])
    assert info["recipe"]["loss"] == {"rkl": 0.9, "ce": 0.1} and info["recipe"]["steps"] == 30
    assert info["heldout"]["acceptance_t1"] == last["acceptance_t1"]
    # draft.path of our draft_model (greedy output = the target's), and HF's assistant_model=
    sd = specdec.load("draft_model", **{"target.path": tiny["target"], "draft.path": folder, "device": "cpu"})
    out = sd.generate([5, 6, 7, 8], max_new_tokens=12, ignore_eos=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = sd.target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                               attention_mask=torch.ones_like(ids))
    assisted = sd.target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                  attention_mask=torch.ones_like(ids), assistant_model=draft)
    assert out.token_ids == plain[0, 4:].tolist() == assisted[0, 4:].tolist()


@pytest.mark.parametrize("tau_interval,expected", [(0, [True, False, False, True]),
                                                    (4, [True, False, True, True])])
def test_the_chain_tau_is_measured_at_the_ends_and_every_tau_interval(tiny, tmp_path, tau_interval, expected):
    """The evaluations between the start and the end measure 1 - TV and the greedy match; the chain
    tau (the expensive part) only at the ends, unless tau_interval asks for it; the run's torch
    thread count is its own and the caller's is restored."""
    before = torch.get_num_threads()
    folder = train_draft(_cfg(tiny, tmp_path / "out", steps=6, eval_interval=2, tau_interval=tau_interval,
                              threads=1 if before != 1 else 2))
    assert torch.get_num_threads() == before
    history = json.load(open(os.path.join(folder, LOG_FILE)))["history"]
    assert [h["step"] for h in history] == [0, 2, 4, 6]
    assert [{"tau_greedy", "tau_t0.8"} <= set(h) for h in history] == expected
    assert all("acceptance_t1" in h and "greedy_match" in h for h in history)
    assert [h["train_time_s"] for h in history] == sorted(h["train_time_s"] for h in history)


def test_loading_a_draft_distilled_for_another_target_warns_with_both_names(tiny, tmp_path):
    folder = train_draft(_cfg(tiny, tmp_path / "out", steps=1, eval_prompts=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # the right target: no warning
        specdec.load("draft_model", **{"target.path": tiny["target"], "draft.path": folder, "device": "cpu"})
    other = tmp_path / "other_target"
    tiny_model("llama", seed=9, sharpen=SHARPEN).save_pretrained(other)
    char_tokenizer().save_pretrained(other)
    with pytest.warns(UserWarning, match="distilled for the target") as caught:
        specdec.load("draft_model", **{"target.path": str(other), "draft.path": folder, "device": "cpu"})
    message = str(caught[0].message)
    assert os.path.abspath(tiny["target"]) in message and str(other) in message


def test_fine_tuning_a_given_draft_and_refusing_another_tokenizer(tiny, tmp_path):
    folder = train_draft(_cfg(tiny, tmp_path / "tuned", draft=tiny["draft"], steps=2, eval_prompts=0))
    tuned = load_file(os.path.join(folder, "model.safetensors"))
    start = load_file(os.path.join(tiny["draft"], "model.safetensors"))
    assert tuned.keys() == start.keys() and any(not torch.equal(tuned[k], start[k].float()) for k in tuned)
    with pytest.raises(IncompatibleModelsError, match="draft=null"):
        train_draft(_cfg(tiny, tmp_path / "foreign", draft=tiny["foreign"], steps=1))


def test_config_errors_help_and_the_shipped_config(tiny, capsys):
    with pytest.raises(ConfigError, match="no target"):
        load_train_draft_config(None, ["steps=3"])
    with pytest.raises(ConfigError, match="valid keys"):
        load_train_draft_config(None, ["target=x", "stepz=3"])
    with pytest.raises(ConfigError, match="data"):
        load_train_draft_config(None, ["target=x", "data=offline"])
    with pytest.raises(ConfigError, match="unknown loss"):
        load_train_draft_config(None, ["target=x", "loss=kl"])
    with pytest.raises(ConfigError, match="prompt_tokens"):
        load_train_draft_config(None, ["target=x", "data=draft", "seq_len=32", "prompt_tokens=31"])
    cfg = load_train_draft_config(None, ["target=x", "loss={rkl: 0.9, ce: 0.1}"])
    assert distill.loss_spec(cfg) == {"rkl": 0.9, "ce": 0.1}
    shipped = load_train_draft_config("train_draft", ["target=x"])      # shipped with target: null
    assert shipped.max_minutes is None and shipped.steps == 360                # sized in steps: the same draft everywhere
    assert shipped.draft is None and shipped.split_file is None
    assert cli_main(["train-draft", "train_draft", "--help"]) == 0
    text = capsys.readouterr().out
    assert "loss" in text and "mix_lambda" in text and "train_draft.yaml" in text


@pytest.mark.slow          # three torchrun launches: about a minute on a busy 2-core machine
def test_two_gloo_processes_make_the_single_process_first_update(tiny, tmp_path):
    args = [f"target={tiny['target']}", "draft=null",
            f"corpus=[{','.join(os.path.join(tiny['corpus'], f'm{i}.py') for i in range(3))}]",
            f"heldout=[{os.path.join(tiny['corpus'], 'm3.py')}]", "draft_config.hidden_size=16",
            "draft_config.num_layers=1", "draft_config.num_heads=2", "seq_len=32", "batch_size=4", "steps=1",
            "lr=1e-2", "warmup_steps=1", "eval_interval=100", "eval_windows=2", "eval_prompts=0",
            "checkpoint_interval=100", "progress=false", "backend=gloo"]
    weights = {}
    for procs in (1, 2):
        out = str(tmp_path / f"p{procs}")
        torchrun("specdec.heads.distill", args, procs, out, port=29600)
        assert json.load(open(os.path.join(out, LOG_FILE)))["processes"] == procs
        weights[procs] = load_file(os.path.join(out, "model.safetensors"))
    start = distill.new_draft(AutoModelForCausalLM.from_pretrained(tiny["target"]),
                              load_train_draft_config(None, args).draft_config, 1).state_dict()
    moved = [k for k in weights[1] if not torch.equal(weights[1][k], start[k])]
    assert moved                                                  # the step changed the draft...
    for name in weights[1]:                                       # ...and the two processes changed it alike
        torch.testing.assert_close(weights[2][name], weights[1][name], rtol=1e-5, atol=1e-6)
