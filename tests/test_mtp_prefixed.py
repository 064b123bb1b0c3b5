"""MTP modules in the mtp.* layout (Qwen3-Next, Qwen3.5: heads/mtp_prefixed.py).

The fixture's mtp.* tensors are written by Hugging Face's own save_pretrained: a one-layer model of the
target's class with a full-attention layer is saved, and its layer and final norm become mtp.layers.0.*
and mtp.norm (per-expert MoE tensors as the checkpoints store them); fc and the two pre-fc norms are
random. The module read from them must compute what that model, reloaded by Hugging Face, computes over
fc's output; drafting with it must be token-identical to greedy generate() on the hybrid target; and
every disagreement between the checkpoint and its config is refused naming the tensor."""
from __future__ import annotations

import copy
import json
import os
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "measure"))
import arch_sweep  # noqa: E402

from conftest import hf_greedy  # noqa: E402

import specdec  # noqa: E402
from specdec.cache import BufferedLayer  # noqa: E402
from specdec.errors import ModelLoadError  # noqa: E402
from specdec.heads.mtp import MtpDrafter, load_mtp  # noqa: E402
from specdec.strategies.mtp import Mtp  # noqa: E402

if not hasattr(transformers, "Qwen3NextConfig"):
    pytest.skip("the installed transformers has no Qwen3-Next", allow_module_level=True)

PROMPTS = [[5, 9, 3, 5, 9, 3, 5, 9, 11, 2, 7], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [40, 41, 7, 40, 41, 8, 40]]
NEW = 16


def config_of(arch: str):
    if arch == "qwen3_next":     # its last layer linear: MtpModel's norm class guess would take the gated norm
        return transformers.Qwen3NextConfig(
            vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1,
            layer_types=["full_attention", "linear_attention"], max_position_embeddings=256)
    return arch_sweep.tiny_config(arch)


def build(config, seed: int):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(config).eval()


def write_checkpoint(arch: str, folder: str) -> dict:
    """A target checkpoint with mtp.* tensors in `folder`; returns the tensors added, and the folder of the
    one-layer model whose layer they hold."""
    target = build(config_of(arch), seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)          # clear-cut greedy choices
    target.generation_config.pad_token_id = 0
    target.save_pretrained(folder)
    text = target.config.get_text_config(decoder=True)
    block_config = copy.deepcopy(target.config)
    block_text = block_config.get_text_config(decoder=True)
    block_text.num_hidden_layers, block_text.layer_types = 1, ["full_attention"]
    block_folder = folder + "-block"
    build(block_config, seed=1).save_pretrained(block_folder)
    block = load_file(os.path.join(block_folder, "model.safetensors"))
    h = text.hidden_size
    mtp = {"mtp.layers.0." + name[len("model.layers.0."):]: t for name, t in block.items()
           if name.startswith("model.layers.0.")}
    mtp["mtp.norm.weight"] = block["model.norm.weight"]
    generator = torch.Generator().manual_seed(2)
    mtp["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=generator) / (2 * h) ** 0.5
    for name in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        mtp[name] = 0.1 * torch.randn(h, generator=generator)
    edit_checkpoint(folder, add=mtp, config={"mtp_num_hidden_layers": 1})
    return {"tensors": mtp, "block": block_folder}


def edit_checkpoint(folder: str, add: dict | None = None, drop: tuple = (), config: dict | None = None) -> None:
    file = os.path.join(folder, "model.safetensors")
    tensors = {name: t for name, t in load_file(file).items() if name not in drop}
    tensors.update(add or {})
    save_file(tensors, file, metadata={"format": "pt"})
    if config:
        path = os.path.join(folder, "config.json")
        with open(path) as handle:
            saved = json.load(handle)
        for key, value in config.items():
            if value is None:
                saved.pop(key, None)
            else:
                saved[key] = value
        with open(path, "w") as handle:
            json.dump(saved, handle)


def load_target(folder: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def saved(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param) / "target")
    written = write_checkpoint(request.param, folder)
    return folder, load_target(folder), written


def test_the_module_computes_what_hugging_face_computes(saved):
    """Our module's output and logits = fc(cat[norm_e(embedding), norm_h(hidden)]) through the one-layer model
    Hugging Face reloads from its own save (its loader merging the per-expert tensors), then the lm_head."""
    folder, target, written = saved
    drafter = MtpDrafter(load_mtp(target), id(target))
    h = target.config.get_text_config(decoder=True).hidden_size
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, target.config.get_text_config(decoder=True).vocab_size, (1, 7), generator=generator)
    hidden = torch.randn(1, 7, h, generator=generator)
    positions = torch.arange(4, 11)[None]
    with torch.no_grad():
        out, logits, _, _ = drafter(hidden, tokens, positions, cache=BufferedLayer(), start=0)
        block = load_target(written["block"])
        norm_class = type(block.get_decoder().layers[0].input_layernorm)
        eps = target.config.get_text_config(decoder=True).rms_norm_eps
        norms = []
        for name in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
            norm = norm_class(h, eps=eps)
            norm.weight.copy_(written["tensors"][name])
            norms.append(norm)
        def through_block(first, second):
            fused = F.linear(torch.cat([first, second], dim=-1), written["tensors"]["mtp.fc.weight"])
            return block.get_decoder()(inputs_embeds=fused, position_ids=positions).last_hidden_state
        embedded, normed_hidden = norms[0](target.get_input_embeddings()(tokens)), norms[1](hidden)
        expected = through_block(embedded, normed_hidden)
        swapped = through_block(normed_hidden, embedded)      # the other order some checkpoints use
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, target.lm_head(expected), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(out, swapped, atol=1e-3), "the projection's order must show, or this proves little"


def test_greedy_identical_through_the_recurrent_targets_chains(saved):
    folder, target, _ = saved
    sd = specdec.load("mtp", **{"target.path": folder, "device": "cpu", "dtype": "float32"})
    drafted = 0
    for prompt in PROMPTS:
        out = sd.generate(prompt, max_new_tokens=NEW, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, NEW, eos_token_id=None, pad_token_id=0), prompt
        drafted += out.stats.proposed_nodes
    assert drafted > 0, "the module must have drafted"


def variant(saved, tmp_path, **edit):
    folder = str(tmp_path / "variant")
    import shutil
    shutil.copytree(saved[0], folder)
    edit_checkpoint(folder, **edit)
    return load_target(folder)


@pytest.mark.parametrize("edit, phrase", [
    (dict(drop=("mtp.layers.0.self_attn.q_proj.weight",)), r"lacks tensor 'mtp\.layers\.0\.self_attn\.q_proj\.weight'"),
    (dict(drop=("mtp.fc.weight",)), r"lacks tensor 'mtp\.fc\.weight'"),
    (dict(add={"mtp.fc.weight": torch.zeros(4, 4)}), r"tensor 'mtp\.fc\.weight' .* has shape \(4, 4\)"),
    (dict(add={"mtp.layers.1.input_layernorm.weight": torch.zeros(4)}),
     r"tensor 'mtp\.layers\.1\.input_layernorm\.weight', which the mtp\.\* layout's one module has not"),
    (dict(add={"mtp.embed_tokens.weight": torch.zeros(4, 4)}), r"tensor 'mtp\.embed_tokens\.weight', which"),
    (dict(config={"mtp_num_hidden_layers": None}), r"announces no MTP layer .*disagree"),
    (dict(config={"mtp_num_hidden_layers": 2}), r"mtp_num_hidden_layers=2"),
])
def test_disagreements_refused_naming_the_tensor(saved, tmp_path, edit, phrase):
    with pytest.raises(ModelLoadError, match=phrase):
        Mtp.for_target(variant(saved, tmp_path, **edit))


def test_a_missing_or_misshaped_expert_is_refused(saved, tmp_path):
    """A MoE block's per-expert tensors are merged on load: one missing or of another shape is refused."""
    name = "mtp.layers.0.mlp.experts.1.up_proj.weight"
    if name not in saved[2]["tensors"]:
        pytest.skip("a dense MLP: no per-expert tensors")
    fused = r"'mtp\.layers\.0\.mlp\.experts\.gate_up_proj'"
    with pytest.raises(ModelLoadError, match=rf"tensors that make {fused} .*do not merge"):
        Mtp.for_target(variant(saved, tmp_path, drop=(name,)))
    misshaped = saved[2]["tensors"][name][:, :-2].contiguous()
    with pytest.raises(ModelLoadError, match=r"do not merge \(RuntimeError: stack expects"):
        Mtp.for_target(variant(saved, tmp_path / "b", add={name: misshaped}))


def test_a_checkpoint_resaved_without_its_modules_is_refused(saved, tmp_path):
    """Hugging Face's save_pretrained drops mtp.*: the config still announces them, the tensors are gone."""
    folder = str(tmp_path / "resaved")
    saved[1].save_pretrained(folder)
    with pytest.raises(ModelLoadError, match="saved without its MTP weights"):
        Mtp.for_target(load_target(folder))


def test_a_tree_is_refused_on_the_recurrent_target(saved):
    """Two children per node make a tree, which one recurrent state cannot follow: refused when drafted."""
    from specdec.errors import StrategyError
    sd = specdec.load("mtp", **{"target.path": saved[0], "device": "cpu", "dtype": "float32", "mtp.top_k": 2,
                                "mtp.max_nodes": 4})
    with pytest.raises(StrategyError, match="linear-attention layers"):
        sd.generate(PROMPTS[0], max_new_tokens=NEW, ignore_eos=True)
