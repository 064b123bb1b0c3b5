"""Medusa heads: the module, the file format (round trip, wrong target, corrupt files) and the
training script (held-out loss goes down; an interrupted run resumes exactly)."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from conftest import char_tokenizer, tiny_model
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.heads import HeadsLayout, MedusaHeads, load_heads, save_heads
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.config import load_train_config
from specdec.heads.io import output_vocab
from specdec.heads.train import CHECKPOINT_FILE, head_losses, train_heads
from specdec.sampling import SamplingParams, TorchRandom
from specdec.strategies.medusa import Medusa
from specdec.types import DecodeState


def noisy_heads(model, num_heads=3, num_layers=2, own_lm_head=False, seed=0, token_conditioned=False) -> MedusaHeads:
    heads = MedusaHeads(HeadsLayout(num_heads, num_layers, model.config.hidden_size, output_vocab(model), own_lm_head,
                                    token_conditioned))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return heads


# ---------------------------------------------------------------------- module
def test_fresh_head_is_the_identity_before_the_lm_head():
    model = tiny_model("llama", seed=0)
    heads = MedusaHeads(HeadsLayout(3, 2, 32, 96))
    heads.attach_lm_head(model.get_output_embeddings())
    hidden = torch.randn(5, 32)
    assert torch.equal(heads.features(hidden), hidden[:, None].expand(5, 3, 32))
    logits = heads(hidden)                                                     # [5, 3, 96]
    assert logits.shape == (5, 3, 96)
    assert torch.allclose(logits[:, 2], model.get_output_embeddings()(hidden))


def test_fresh_token_conditioned_head_is_the_identity_and_reads_the_token():
    model = tiny_model("llama", seed=0)
    heads = MedusaHeads(HeadsLayout(3, 1, 32, 96, token_conditioned=True))
    heads.attach_lm_head(model.get_output_embeddings())
    heads.attach_embedding(model.get_input_embeddings())
    hidden, prev_ids = torch.randn(5, 32), torch.randint(3, 96, (5, 3))
    assert torch.equal(heads.features(hidden, prev_ids), hidden[:, None].expand(5, 3, 32))
    with pytest.raises(ValueError, match="prev_ids"):
        heads(hidden)
    with torch.no_grad():
        for proj in heads.token_projs:
            proj.weight.normal_()
    logits = heads(hidden, prev_ids)                                           # [5, 3, 96]
    assert not torch.allclose(logits, heads(hidden, (prev_ids + 1) % 96))
    for k in (1, 2, 3):     # head k alone, on column k - 1, is what the stacked forward gives
        torch.testing.assert_close(heads.head_logits(k, hidden, prev_ids[:, k - 1]), logits[:, k - 1])


def test_verifier_hidden_state_feeds_the_lm_head(arch):
    """The heads train on hidden_states[-1] and the verifier hands the same: post final norm,
    so the target's lm_head on it gives the target's logits."""
    model = tiny_model(arch, seed=0)
    out = model(input_ids=torch.tensor([[5, 9, 11, 3]]), output_hidden_states=True)
    assert torch.allclose(model.get_output_embeddings()(out.hidden_states[-1]), out.logits, atol=1e-5)


# ---------------------------------------------------------------------- file format
def _proposal(heads, model, hidden):
    medusa = Medusa(heads, max_nodes=8, top_k=3)
    medusa.bind(model, None)
    state = DecodeState(token_ids=[4, 5], prompt_len=2, sampling=SamplingParams(), rng=TorchRandom(torch.Generator()),
                        max_depth=10, prompt_hidden=hidden[None])
    medusa.reset(state)
    return medusa.propose(state)


@pytest.mark.parametrize("own_lm_head,token_conditioned", [(False, False), (True, False), (False, True)])
def test_save_load_round_trip_gives_identical_proposals(tmp_path, own_lm_head, token_conditioned):
    model = tiny_model("gpt2", seed=0)
    heads = noisy_heads(model, own_lm_head=own_lm_head, token_conditioned=token_conditioned)
    folder = save_heads(str(tmp_path / "heads"), heads, model)
    assert sorted(os.listdir(folder)) == ["heads.json", "heads.safetensors"]
    saved = load_file(os.path.join(folder, "heads.safetensors"))
    assert not any(t.shape == (96, 32) for t in saved.values()) or own_lm_head   # shared lm_head not saved
    config = json.load(open(os.path.join(folder, "heads.json")))
    assert config["layout"] == {"num_heads": 3, "num_layers": 2, "hidden_size": 32, "vocab_size": 96,
                                "own_lm_head": own_lm_head, "token_conditioned": token_conditioned}
    assert config["target"]["architecture"] == "GPT2LMHeadModel"

    loaded = load_heads(folder, model)
    hidden = torch.randn(32)
    before, after = _proposal(heads, model, hidden), _proposal(loaded, model, hidden)
    assert before.num_nodes > 1
    assert torch.equal(before.tokens, after.tokens) and before.parents == after.parents


def test_heads_for_another_target_are_refused(tmp_path):
    model = tiny_model("llama", seed=0)
    folder = save_heads(str(tmp_path / "heads"), noisy_heads(model), model)
    same_shape_other_weights = tiny_model("llama", seed=1)
    with pytest.raises(IncompatibleModelsError, match="fingerprint"):
        load_heads(folder, same_shape_other_weights)
    with pytest.raises(IncompatibleModelsError, match="architecture"):
        load_heads(folder, tiny_model("qwen2", seed=0))
    with pytest.raises(IncompatibleModelsError, match="hidden_size=32"):
        load_heads(folder, tiny_model("llama", seed=0, hidden=64))
    heads = load_heads(folder)                       # no target: no check yet ...
    with pytest.raises(IncompatibleModelsError, match="train-heads"):
        Medusa(heads).bind(same_shape_other_weights, None)     # ... until the strategy binds
    load_heads(folder, model.to(torch.bfloat16))     # the same target in another dtype still fits


def test_corrupt_truncated_or_missing_files_are_clear_errors(tmp_path):
    model = tiny_model("llama", seed=0)
    folder = save_heads(str(tmp_path / "heads"), noisy_heads(model), model)
    weights = os.path.join(folder, "heads.safetensors")
    data = open(weights, "rb").read()
    with open(weights, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_heads(folder, model)
    with open(weights, "wb") as f:
        f.write(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_heads(folder, model)
    os.remove(weights)
    with pytest.raises(ModelLoadError, match="no heads.safetensors"):
        load_heads(folder, model)
    with open(os.path.join(folder, "heads.json"), "w") as f:
        f.write('{"format": "specdec-medusa-heads", "layout": {"num_heads": 3')
    with pytest.raises(ModelLoadError, match="corrupt"):
        load_heads(folder, model)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_heads(str(tmp_path / "nowhere"), model)


# ---------------------------------------------------------------------- training
def test_head_losses_shift_targets_by_head_distance():
    """Head k at position t is scored against the target's logits at t + k: heads that copy the
    teacher from k positions ahead score top-1 = 1 and the teacher's own entropy as loss."""
    teacher = torch.randn(2, 10, 7) * 3                                     # [B, T, V]
    student = torch.stack([torch.roll(teacher, -k, dims=1) for k in (1, 2)], dim=2)   # [B, T, 2, V]
    losses, top1, top5 = head_losses(student, teacher)
    probs = teacher.softmax(-1)
    for k in (1, 2):
        entropy = -(probs[:, k:] * probs[:, k:].log()).sum(-1).mean()
        assert losses[k - 1].item() == pytest.approx(entropy.item(), rel=1e-5)
    assert top1.tolist() == [1.0, 1.0] and top5.tolist() == [1.0, 1.0]
    unshifted, _, _ = head_losses(teacher[:, :, None].expand(2, 10, 2, 7), teacher)
    assert (unshifted > losses).all()


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A tiny llama saved as a checkpoint folder (with a char tokenizer) and a tiny text corpus."""
    root = tmp_path_factory.mktemp("tiny")
    model = tiny_model("llama", seed=0, sharpen=3.0)
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
            "heldout": [os.path.join(corpus, "m5.py")], "num_heads": 2, "num_layers": 1, "seq_len": 32,
            "batch_size": 4, "steps": 30, "lr": 1e-2, "warmup_steps": 2, "eval_interval": 100,
            "eval_windows": 4, "checkpoint_interval": 10, "progress": False}
    base.update(overrides)
    return load_train_config(None, base)


def test_training_lowers_heldout_loss(tiny_target, tmp_path):
    target, corpus = tiny_target
    folder = train_heads(_cfg(target, corpus, str(tmp_path / "run")))
    log = json.load(open(os.path.join(folder, "train.json")))
    first, last = log["history"][0], log["history"][-1]
    assert (first["step"], last["step"]) == (0, 30)
    assert last["loss"] < first["loss"] - 0.05
    assert all(after < before for before, after in zip(first["head_loss"], last["head_loss"]))
    heads = load_heads(folder, tiny_model("llama", seed=0, sharpen=3.0))
    assert heads.num_heads == 2


def test_heads_files_without_token_conditioning_key_load_as_plain_medusa(tmp_path):
    """heads.json written before token conditioning existed has no such layout key."""
    model = tiny_model("llama", seed=0)
    folder = save_heads(str(tmp_path / "heads"), noisy_heads(model), model)
    path = os.path.join(folder, "heads.json")
    config = json.load(open(path))
    del config["layout"]["token_conditioned"]
    json.dump(config, open(path, "w"))
    assert load_heads(folder, model).layout.token_conditioned is False


def test_interrupted_run_resumes_from_its_checkpoint(tiny_target, tmp_path):
    target, corpus = tiny_target
    straight = train_heads(_cfg(target, corpus, str(tmp_path / "straight"), steps=6, checkpoint_interval=3))

    def interrupt(step, metrics):
        if step == 5:
            raise KeyboardInterrupt
    resumed_dir = str(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        train_heads(_cfg(target, corpus, resumed_dir, steps=6, checkpoint_interval=3), on_step=interrupt)
    assert read_checkpoint(os.path.join(resumed_dir, CHECKPOINT_FILE))["step"] == 5   # saved on the interrupt
    assert not os.path.exists(os.path.join(resumed_dir, "heads.json"))     # no final heads yet
    steps_seen = []
    train_heads(_cfg(target, corpus, resumed_dir, steps=6, checkpoint_interval=3),
                on_step=lambda step, metrics: steps_seen.append(step))
    assert steps_seen == [6]

    a = read_checkpoint(os.path.join(straight, CHECKPOINT_FILE))
    b = read_checkpoint(os.path.join(resumed_dir, CHECKPOINT_FILE))
    assert a["step"] == b["step"] == 6
    for name in a["module"]:
        torch.testing.assert_close(a["module"][name], b["module"][name], rtol=0, atol=1e-6)
    opt_a, opt_b = a["optimizer"], b["optimizer"]
    assert opt_a["param_groups"] == opt_b["param_groups"]
    for index, state in opt_a["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(value, opt_b["state"][index][key], rtol=0, atol=1e-6)
    assert torch.equal(a["window_rng"], b["window_rng"])


def test_train_config_errors_name_the_valid_keys():
    with pytest.raises(ConfigError, match="valid keys"):
        load_train_config(None, ["target=x", "stepz=3"])
    with pytest.raises(ConfigError, match="no target"):
        load_train_config(None, ["steps=3"])
    cfg = load_train_config("train_heads", ["steps=7", "target=x"])
    assert cfg.steps == 7 and cfg.split_file is None     # shipped: no paths outside the repository (the default
    #   family fills target and split_file: tests/test_train_command.py)
