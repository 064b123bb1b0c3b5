"""`specdec train mtp`: one MTP module in DeepSeek-V3's layout trained for a target that ships none (the EAGLE
trainer, layout=mtp, cross-entropy only), saved apart and read back by the `mtp` strategy (mtp.path).

* the training forward (past keys given) is the strategy's (a cache): training sees what drafting sees;
* a few steps lower the held-out step losses; the saved tensors carry the checkpoint's names and are the
  trained ones; the strategy drafts with them token-identically to Hugging Face generate(do_sample=False);
* modules for another target, and a missing, extra, misshaped or stray tensor, are refused naming it;
* the config: layout=mtp is `specdec train mtp`'s, and the keys that do not apply are refused.
The interrupted-run resume test is test_eagle_train.py's, run with layout=mtp too.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import hf_greedy, tiny_model
from test_mtp import FAULTY_TENSORS
from test_eagle_train import SHARPEN, _cfg, tiny_target  # noqa: F401 - tiny_target: the fixture
from specdec import Speculator
from specdec.cache import BufferedLayer
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.heads.checkpoint import read_checkpoint
from specdec.heads.eagle_train import (CHECKPOINT_FILE, LOG_FILE, load_train_eagle_config, load_train_mtp_config,
                                       train_eagle, ttt_visible)
from specdec.heads.mtp import CONFIG_FILE, WEIGHTS_FILE, MtpDrafter, mtp_model_for
from specdec.strategies.mtp import Mtp

PROMPT = [5, 17, 33, 9, 41, 60, 70]
LAYER = 2                    # the tiny target has 2 decoder layers: its MTP module is model.layers.2.*


def target_model():
    """The tiny target as trained (test_eagle_train's fixture saves this one)."""
    return tiny_model("llama", seed=0, sharpen=SHARPEN)


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """(the output folder of 60 training steps, the target folder)."""
    target, corpus = tiny_target
    out = str(tmp_path_factory.mktemp("mtp") / "out")
    return train_eagle(_cfg(target, corpus, out, layout="mtp", steps=60, lr=1e-2)), target


def test_the_training_forward_is_the_drafting_forward():
    """Step 2 of the unrolled pass at row s equals the strategy's tree node on top of the committed rows
    0..s - 1 in the module's cache."""
    model = tiny_model("llama", seed=0)
    torch.manual_seed(1)
    drafter = MtpDrafter(mtp_model_for(model, 1), id(model))
    ids = torch.randint(3, 96, (1, 12))
    with torch.no_grad():
        g = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][:, :-1]        # [1, 11, H]
        tokens, rows = ids[:, 1:], 11
        positions = torch.arange(rows)[None]
        out1, _, k1, v1 = drafter(g, tokens, positions, visible=ttt_visible(rows, 1, "cpu"))
        g2 = torch.cat([torch.zeros_like(out1[:, :1]), out1[:, :-1]], 1)
        _, logits2, _, _ = drafter(g2, tokens, positions, k1, v1, ttt_visible(rows, 2, "cpu"))
        s, cache = 7, BufferedLayer()
        root_out, _, _, _ = drafter(g[:, :s], tokens[:, :s], positions[:, :s], cache=cache, start=0)
        _, node_logits, _, _ = drafter(root_out[:, -1:], tokens[:, s: s + 1], positions[:, s: s + 1], cache=cache,
                                       start=s)
    torch.testing.assert_close(logits2[0, s], node_logits[0, 0], atol=1e-5, rtol=1e-5)


def test_fresh_modules_leave_the_target_as_it_is():
    model = tiny_model("llama", seed=0)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    mtp = mtp_model_for(model, 1)
    assert mtp.shared_head is model.lm_head and mtp.embed_tokens is model.get_input_embeddings()
    assert not hasattr(model.config, "num_mtp_layers")
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("arch", ["qwen2", "gemma2", "qwen3_next"])
def test_fresh_modules_for_targets_with_layer_types(arch):
    """A config with layer_types (sliding or linear-attention layers) and no mtp_layer_types, which transformers'
    get_mtp_config refuses as ambiguous: the module's block is a full-attention layer, normed with its own class,
    initialised as the target initialises its own layers."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "measure"))
    import arch_sweep
    model = arch_sweep.build(arch_sweep.tiny_config(arch))
    layer = mtp_model_for(model, 1).layers[0]
    block = layer.mtp_block
    assert getattr(block, "attention_type", getattr(block, "block_type", "full_attention")) == "full_attention"
    assert hasattr(block, "self_attn") and type(layer.enorm) is type(block.input_layernorm)
    for name, weight in layer.named_parameters():      # initialised as the target's own (MoE experts included)
        assert torch.isfinite(weight).all(), name
        assert weight.ndim == 1 or weight.std() > 0, f"{name} left as allocated"
    torch.manual_seed(0)
    drafter = MtpDrafter(mtp_model_for(model, 1), id(model))
    hidden = torch.randn(1, 5, model.config.get_text_config(decoder=True).hidden_size)
    out, logits, _, _ = drafter(hidden, torch.arange(3, 8)[None], torch.arange(5)[None], cache=BufferedLayer())
    assert out.shape == hidden.shape and torch.isfinite(logits).all()


def test_training_lowers_the_step_losses_and_saves_the_layout(trained):
    folder, _ = trained
    log = json.load(open(os.path.join(folder, LOG_FILE)))
    first, last = log["history"][0], log["history"][-1]
    assert (first["step"], last["step"]) == (0, 60)
    assert all(after < before - 0.5 for before, after in zip(first["step_loss"], last["step_loss"]))
    info = json.load(open(os.path.join(folder, CONFIG_FILE)))
    assert info["layout"] == {"hidden_size": 32, "modules": 1, "feature_layers": [-1]}
    assert info["training"]["heldout"]["acceptance"] == last["acceptance"]
    names = set(load_file(os.path.join(folder, WEIGHTS_FILE)))
    assert {f"model.layers.{LAYER}.{name}" for name in (
        "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "input_layernorm.weight",
        "self_attn.q_proj.weight", "mlp.down_proj.weight")} <= names
    assert not any("embed_tokens" in name or "shared_head.head" in name for name in names)   # the target's
    checkpointed = read_checkpoint(os.path.join(folder, CHECKPOINT_FILE))["module"]      # the module's own, only
    assert "0.eh_proj.weight" in checkpointed and not any("embed" in name or "lm_head" in name for name in checkpointed)


def test_the_strategy_reads_the_trained_module(trained):
    folder, _ = trained
    saved = load_file(os.path.join(folder, WEIGHTS_FILE))
    layer = Mtp.for_target(target_model(), modules=folder).drafter.mtp.layers[0]
    torch.testing.assert_close(layer.eh_proj.weight, saved[f"model.layers.{LAYER}.eh_proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(layer.post_norm.weight, saved[f"model.layers.{LAYER}.shared_head.norm.weight"],
                               rtol=0, atol=0)
    torch.testing.assert_close(layer.mtp_block.self_attn.q_proj.weight,
                               saved[f"model.layers.{LAYER}.self_attn.q_proj.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("shape", [dict(depth=3, max_nodes=3), dict(depth=3, top_k=2, max_nodes=6)])
def test_greedy_identity_with_the_trained_module(trained, shape):
    folder, _ = trained
    model = target_model()
    out = Speculator(model, None, Mtp.for_target(model, modules=folder, **shape)).generate(
        PROMPT, max_new_tokens=24, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, 24, eos_token_id=None)
    assert out.stats.proposed_nodes > 0


def test_the_config_loads_it_by_mtp_path(trained):
    import specdec
    folder, target = trained
    sd = specdec.load("mtp", **{"target.path": target, "mtp.path": folder, "device": "cpu", "dtype": "float32"})
    assert sd.strategy.name == "mtp"
    assert sd.generate(PROMPT, max_new_tokens=12, ignore_eos=True).token_ids == \
        hf_greedy(sd.target, PROMPT, 12, eos_token_id=None)


# ---------------------------------------------------------------------- refusals
def test_modules_for_another_target_are_refused(trained):
    folder, _ = trained
    with pytest.raises(IncompatibleModelsError, match="fingerprint differs"):
        Mtp.for_target(tiny_model("llama", seed=1, sharpen=SHARPEN), modules=folder)
    with pytest.raises(IncompatibleModelsError, match="hidden_size=32"):
        Mtp.for_target(tiny_model("llama", seed=0, hidden=48), modules=folder)


def edited(folder: str, tmp_path, edit) -> str:
    """A copy of the module folder with its tensors edited by edit({name: tensor})."""
    copy = str(tmp_path / "edited")
    shutil.copytree(folder, copy)
    tensors = load_file(os.path.join(copy, WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, os.path.join(copy, WEIGHTS_FILE))
    return copy


@pytest.mark.parametrize("edit, phrase", FAULTY_TENSORS + [
    (lambda t: t.__setitem__("lm_head.weight", torch.ones(3)), r"holds tensor 'lm_head\.weight', which is no MTP"),
])
def test_a_faulty_module_file_is_refused_naming_the_tensor(trained, tmp_path, edit, phrase):
    with pytest.raises(ModelLoadError, match=phrase):
        Mtp.for_target(target_model(), modules=edited(trained[0], tmp_path, edit))


def test_a_folder_without_modules_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="has no mtp.json"):
        Mtp.for_target(target_model(), modules=str(tmp_path))


def test_the_config_of_specdec_train_mtp():
    assert load_train_mtp_config(None, ["target=x"]).layout == "mtp"
    shipped, eagle = load_train_mtp_config("train_mtp", ["target=x"]), load_train_eagle_config("train_eagle", ["target=x"])
    for key in ("steps", "batch_size", "seq_len", "seed", "lr", "ttt_steps", "warmup_steps", "bf16"):
        assert shipped[key] == eagle[key], key                  # the two train at equal settings
    with pytest.raises(ConfigError, match="trains layout=mtp"):
        load_train_mtp_config("train_eagle", ["target=x"])
    with pytest.raises(ConfigError, match="leave intermediate_size null"):
        load_train_mtp_config(None, ["target=x", "intermediate_size=64"])
    with pytest.raises(ConfigError, match="last hidden state"):
        load_train_mtp_config(None, ["target=x", "feature_layers=[1]"])
