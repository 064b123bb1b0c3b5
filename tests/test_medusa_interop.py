"""Medusa heads in and out of FasterDecoding's and vLLM's layouts (specdec.heads.medusa_formats):
round trips (ours -> export -> import drafts the same tokens; foreign -> import -> export gives the
same tensors back), the names and shapes those tools' loaders expect, and clear errors."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from conftest import hf_greedy, tiny_model
from specdec.api import Speculator
from specdec.cli import main as cli_main
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.heads.io import bind_heads, load_heads, output_vocab, save_heads
from specdec.heads.medusa_formats import detect_heads_format, export_heads, import_heads
from specdec.strategies.medusa import Medusa

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]


def noisy_heads(model, num_heads=3, num_layers=1, own_lm_head=False, token_conditioned=False, seed=0):
    heads = MedusaHeads(HeadsLayout(num_heads, num_layers, model.config.hidden_size, output_vocab(model),
                                    own_lm_head=own_lm_head, token_conditioned=token_conditioned))
    heads.init_own_lm_heads(model.get_output_embeddings().weight.detach())
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return bind_heads(heads, model)


def run(model, heads):
    out = Speculator(model, None, Medusa(heads, max_nodes=8, top_k=3)).generate(PROMPT, max_new_tokens=24,
                                                                                 ignore_eos=True)
    return out.token_ids, out.stats.target_forwards


def logits(heads, model):
    torch.manual_seed(5)
    hidden = torch.randn(4, model.config.hidden_size)
    return heads(hidden)                                             # [4, K, V]


@pytest.mark.parametrize("fmt", ["vllm", "medusa"])
@pytest.mark.parametrize("own_lm_head", [False, True])
def test_export_then_import_drafts_the_same_tokens(tmp_path, fmt, own_lm_head):
    model = tiny_model("llama", seed=1, sharpen=4.0)
    heads = noisy_heads(model, own_lm_head=own_lm_head)
    out = export_heads(heads, str(tmp_path / fmt), fmt, target=model, base_model="tiny-llama")
    assert detect_heads_format(out) == fmt
    back = load_heads(out, model)               # load_heads detects the foreign layout
    torch.testing.assert_close(logits(back, model), logits(heads, model), rtol=0, atol=0)
    tokens, forwards = run(model, back)
    assert (tokens, forwards) == run(model, heads)          # same drafts: same forwards, same text
    assert tokens == hf_greedy(model, PROMPT, 24, eos_token_id=None)


def test_vllm_original_lm_head_of_the_target_is_shared_not_copied(tmp_path):
    model = tiny_model("llama", seed=1)
    out = export_heads(noisy_heads(model), str(tmp_path / "v"), "vllm", target=model)
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["original_lm_head"] is True
    assert sorted(k for k in load_file(os.path.join(out, "model.safetensors")) if "lm_head" in k) == ["lm_heads.0.weight"]
    back = import_heads(out, model)
    assert back.lm_heads is None               # the target's lm_head, used in place
    other = tiny_model("llama", seed=7)        # same shapes, another lm_head: its own copies
    assert import_heads(out, other).lm_heads is not None


# ------------------------------------------------------------------ foreign -> ours -> foreign
def vllm_checkpoint(folder, hidden, vocab, num_heads=3, num_layers=2, bias=True, shared=False, prefix=""):
    """A checkpoint in vLLM's Medusa layout, written as its loader reads it (names from
    vllm/model_executor/models/medusa.py: ResidualBlock.layers, Medusa.blocks / lm_heads, the
    `medusa_heads.` prefix it strips; config keys from vllm/transformers_utils/configs/medusa.py)."""
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(3)
    state = {}
    for i in range(num_heads):
        for j in range(num_layers):
            state[f"{prefix}blocks.{i}.layers.{j}.weight"] = torch.randn(hidden, hidden, generator=g)
            if bias:
                state[f"{prefix}blocks.{i}.layers.{j}.bias"] = torch.randn(hidden, generator=g)
        if not shared or i == 0:
            state[f"{prefix}lm_heads.{i}.weight"] = torch.randn(vocab, hidden, generator=g)
    save_file(state, os.path.join(folder, "model.safetensors"))
    json.dump({"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": hidden, "vocab_size": vocab,
               "num_heads": num_heads, "num_hidden_layers": num_layers, "truncated_vocab_size": vocab,
               "medusa_fc_bias": bias, "original_lm_head": shared}, open(os.path.join(folder, "config.json"), "w"))
    return state


def faster_decoding_checkpoint(folder, hidden, vocab, num_heads=3, num_layers=1, as_pt=True):
    """FasterDecoding's layout (medusa/model/medusa_model.py: medusa_head[i] = Sequential(ResBlock * L,
    Linear(H, V, bias=False)), saved with torch.save as medusa_lm_head.pt or as safetensors)."""
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(4)
    state = {}
    for i in range(num_heads):
        block = (torch.randn(hidden, hidden, generator=g), torch.randn(hidden, generator=g))
        for j in range(num_layers):                     # one module repeated: equal tensors
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = block
        state[f"{i}.{num_layers}.weight"] = torch.randn(vocab, hidden, generator=g)
    if as_pt:
        torch.save(state, os.path.join(folder, "medusa_lm_head.pt"))
    else:
        save_file({k: v.clone() for k, v in state.items()}, os.path.join(folder, "medusa_lm_head.safetensors"))
    json.dump({"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "tiny"},
              open(os.path.join(folder, "config.json"), "w"))
    return state


@pytest.mark.parametrize("bias,shared,prefix", [(True, False, ""), (False, False, "medusa_heads."), (True, True, "")])
def test_vllm_layout_round_trips_to_the_same_tensors(tmp_path, bias, shared, prefix):
    model = tiny_model("llama", seed=1)
    hidden, vocab = model.config.hidden_size, output_vocab(model)
    original = vllm_checkpoint(str(tmp_path / "in"), hidden, vocab, bias=bias, shared=shared, prefix=prefix)
    heads = import_heads(str(tmp_path / "in"), model)
    out = export_heads(heads, str(tmp_path / "out"), "vllm")
    written = load_file(os.path.join(out, "model.safetensors"))
    expected = {k[len(prefix):]: v for k, v in original.items()}
    if not bias:                       # we always run a bias; the one written is zero
        assert all(torch.count_nonzero(written.pop(k)) == 0 for k in list(written) if k.endswith(".bias"))
    assert sorted(written) == sorted(expected)
    for name in expected:
        assert torch.equal(written[name], expected[name]), name
    assert json.load(open(os.path.join(out, "config.json")))["original_lm_head"] is shared


@pytest.mark.parametrize("as_pt", [True, False])
def test_faster_decoding_layout_round_trips_to_the_same_tensors(tmp_path, as_pt):
    model = tiny_model("llama", seed=1)
    original = faster_decoding_checkpoint(str(tmp_path / "in"), model.config.hidden_size, output_vocab(model),
                                          num_layers=2, as_pt=as_pt)
    heads = import_heads(str(tmp_path / "in"), model)
    written = load_file(os.path.join(export_heads(heads, str(tmp_path / "out"), "medusa"),
                                     "medusa_lm_head.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(torch.equal(written[k], original[k]) for k in original)


# ------------------------------------------------------------------ their modules, as their loaders build them
class VllmResidualBlock(nn.Module):      # vllm/model_executor/models/medusa.py ResidualBlock
    def __init__(self, hidden, num_layers, bias):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class VllmMedusa(nn.Module):             # its Medusa: blocks, lm_heads (or one lm_head with original_lm_head)
    def __init__(self, config):
        super().__init__()
        h, v, k, n = config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_hidden_layers"]
        self.blocks = nn.ModuleList(VllmResidualBlock(h, n, config.get("medusa_fc_bias", False)) for _ in range(k))
        self.shared = config.get("original_lm_head", False)
        if self.shared:
            self.lm_head = nn.Linear(h, v, bias=False)
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(k))

    def load(self, state):               # its load_weights: strip the prefix, lm_heads.0 -> lm_head when shared
        state = {k.replace("medusa_heads.", ""): v for k, v in state.items()}
        if self.shared:
            state["lm_head.weight"] = state.pop("lm_heads.0.weight")
        self.load_state_dict(state, strict=True)

    def forward(self, hidden):
        heads = [self.lm_head] * len(self.blocks) if self.shared else self.lm_heads
        return torch.stack([head(block(hidden)) for block, head in zip(self.blocks, heads)], dim=-2)


@pytest.mark.parametrize("own_lm_head", [False, True])
def test_vllm_module_loads_our_export_strictly_and_computes_our_logits(tmp_path, own_lm_head):
    model = tiny_model("llama", seed=1)
    heads = noisy_heads(model, num_layers=2, own_lm_head=own_lm_head)
    out = export_heads(heads, str(tmp_path / "v"), "vllm", target=model)
    theirs = VllmMedusa(json.load(open(os.path.join(out, "config.json"))))
    theirs.load(load_file(os.path.join(out, "model.safetensors")))
    hidden = torch.randn(4, model.config.hidden_size)
    torch.testing.assert_close(theirs(hidden), heads(hidden))


def test_faster_decoding_module_loads_our_export_and_computes_our_logits(tmp_path):
    model = tiny_model("llama", seed=1)
    heads = noisy_heads(model, num_layers=1)
    out = export_heads(heads, str(tmp_path / "m"), "medusa", target=model)
    config = json.load(open(os.path.join(out, "config.json")))
    h, v = model.config.hidden_size, output_vocab(model)

    class ResBlock(nn.Module):           # medusa/model/medusa_model.py ResBlock: x + SiLU(linear(x))
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(h, h)

        def forward(self, x):
            return x + nn.functional.silu(self.linear(x))

    # MedusaModel.medusa_head: Sequential(*([ResBlock] * L), Linear(H, V, bias=False)) per head
    theirs = nn.ModuleList(nn.Sequential(*([ResBlock()] * config["medusa_num_layers"]), nn.Linear(h, v, bias=False))
                           for _ in range(config["medusa_num_heads"]))
    theirs.load_state_dict(load_file(os.path.join(out, "medusa_lm_head.safetensors")), strict=True)
    hidden = torch.randn(4, h)
    torch.testing.assert_close(torch.stack([head(hidden) for head in theirs], dim=-2), heads(hidden))


# ------------------------------------------------------------------ errors
def test_token_conditioned_heads_are_not_exported(tmp_path):
    model = tiny_model("llama", seed=1)
    with pytest.raises(ConfigError, match="token_conditioned=false"):
        export_heads(noisy_heads(model, token_conditioned=True), str(tmp_path / "x"), "vllm", target=model)


def test_faster_decoding_export_refuses_differing_blocks(tmp_path):
    model = tiny_model("llama", seed=1)
    with pytest.raises(ConfigError, match="num_layers=1"):
        export_heads(noisy_heads(model, num_layers=2), str(tmp_path / "x"), "medusa", target=model)


def test_shared_lm_head_export_needs_the_target(tmp_path):
    model = tiny_model("llama", seed=1)
    with pytest.raises(ConfigError, match="--target"):
        export_heads(noisy_heads(model), str(tmp_path / "x"), "vllm")


def test_foreign_heads_for_another_target_or_broken_files_are_clear_errors(tmp_path):
    model = tiny_model("llama", seed=1)
    hidden, vocab = model.config.hidden_size, output_vocab(model)
    vllm_checkpoint(str(tmp_path / "wide"), hidden * 2, vocab)
    with pytest.raises(IncompatibleModelsError, match="hidden size 64"):
        load_heads(str(tmp_path / "wide"), model)
    state = vllm_checkpoint(str(tmp_path / "missing"), hidden, vocab)
    del state["blocks.1.layers.0.weight"]
    save_file(state, str(tmp_path / "missing" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="blocks.1.layers.0.weight"):
        load_heads(str(tmp_path / "missing"), model)
    faster_decoding_checkpoint(str(tmp_path / "corrupt"), hidden, vocab)
    with open(tmp_path / "corrupt" / "medusa_lm_head.pt", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_heads(str(tmp_path / "corrupt"), model)
    vllm_checkpoint(str(tmp_path / "trunc"), hidden, vocab)
    config = json.load(open(tmp_path / "trunc" / "config.json"))
    json.dump({**config, "truncated_vocab_size": vocab // 2}, open(tmp_path / "trunc" / "config.json", "w"))
    with pytest.raises(ModelLoadError, match="truncated_vocab_size"):
        load_heads(str(tmp_path / "trunc"), model)


def test_cli_exports_trained_heads_for_vllm(tmp_path, capsys):
    model = tiny_model("llama", seed=1)
    model.save_pretrained(tmp_path / "target")
    folder = save_heads(str(tmp_path / "heads"), noisy_heads(model), model)
    code = cli_main(["export", "medusa", folder, "--format", "vllm", "--out", str(tmp_path / "out"),
                     "--target", str(tmp_path / "target")])
    assert code == 0
    back = load_heads(str(tmp_path / "out"), model)
    assert run(model, back) == run(model, load_heads(folder, model))
    assert cli_main(["export", "medusa", folder, "--format", "sglang", "--out", str(tmp_path / "o2")]) == 2
    assert "--format vllm or medusa" in capsys.readouterr().err
    other = tiny_model("llama", seed=9)
    other.save_pretrained(tmp_path / "other")
    assert cli_main(["export", "medusa", folder, "--format", "vllm", "--out", str(tmp_path / "o3"),
                     "--target", str(tmp_path / "other")]) == 2
    assert "fingerprint" in capsys.readouterr().err
