"""EAGLE-3 drafters in and out: our checkpoint, speculators', the EAGLE repository's and SGLang's
layouts round-trip (same drafts, same tensors), and whatever does not fit the target is a clear
error. Conformance with speculators' own loader and forward: tests/test_speculators_conformance.py."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import char_tokenizer, hf_greedy, tiny_model
from eagle_helpers import random_drafter
from specdec.api import Speculator
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.heads.eagle3 import Eagle3Drafter
from specdec.heads.eagle_io import load_eagle, save_eagle
from specdec.heads.eagle_formats import detect_eagle_format, export_eagle3, import_eagle3
from specdec.strategies.eagle import Eagle

PROMPT = list(range(5, 17))
LAYERS = (2, 4, 5)              # the default of an 8-layer target: layers 2, L/2, L - 3
DRAFT_VOCAB = [0, 2, 5, 7, 8, 9, 11, 13, 20, 33, 40, 41, 60, 61, 62, 90]


def target_model(seed: int = 1, **kw):
    return tiny_model("llama", seed=seed, layers=8, sharpen=4.0, **kw)


def drafter_for(model, seed: int = 0, layers=LAYERS) -> Eagle3Drafter:
    return random_drafter(model, layers, seed=seed, draft_vocab=DRAFT_VOCAB)


def drafts(model, drafter, tokens: int = 16) -> list[int]:
    out = Speculator(model, None, Eagle(drafter, max_nodes=6, top_k=3, depth=4)).generate(
        PROMPT, max_new_tokens=tokens, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, tokens, min_new_tokens=tokens)
    return out.stats.accepted_lengths


def logits_of(drafter, model, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(1, 5, len(LAYERS) * model.config.hidden_size, generator=gen)
    tokens = torch.randint(0, model.config.vocab_size, (1, 5), generator=gen)
    with torch.no_grad():
        _, logits, _, _ = drafter(drafter.input_features(features), tokens, torch.arange(5)[None])
    return logits


@pytest.mark.parametrize("fmt", ["speculators", "sglang", "eagle"])
def test_export_then_import_drafts_the_same(tmp_path, fmt):
    model = target_model()
    drafter = drafter_for(model)
    drafter.attach_embedding(model.get_input_embeddings())
    export_eagle3(drafter, str(tmp_path), fmt, target=model, verifier="tiny/target")
    assert detect_eagle_format(str(tmp_path)) == ("speculators" if fmt == "speculators" else "eagle")
    loaded = load_eagle(str(tmp_path), model)
    assert isinstance(loaded, Eagle3Drafter) and loaded.layout == drafter.layout
    assert not loaded.layout.own_embedding          # the written embedding is the target's: shared again
    torch.testing.assert_close(logits_of(loaded, model), logits_of(drafter, model), rtol=0, atol=0)
    assert drafts(model, loaded) == drafts(model, drafter)


@pytest.mark.parametrize("fmt", ["speculators", "sglang", "eagle"])
def test_foreign_layout_import_export_gives_the_same_tensors(tmp_path, fmt):
    """A folder in each layout (with an embedding of its own, not the target's) -> import -> export:
    the same tensors under the same names."""
    model = target_model()
    drafter = drafter_for(model)
    drafter.attach_embedding(model.get_input_embeddings())
    first = tmp_path / "first"
    export_eagle3(drafter, str(first), fmt, target=model, verifier="tiny/target")
    weights = "pytorch_model.bin" if fmt == "eagle" else "model.safetensors"
    read = (lambda p: torch.load(p, weights_only=True)) if fmt == "eagle" else load_file
    state = read(str(first / weights))
    state["embed_tokens.weight"] = torch.randn_like(state["embed_tokens.weight"])    # trained, not the target's
    if fmt == "eagle":
        torch.save(state, str(first / weights))
    else:
        save_file(state, str(first / weights))
    imported = load_eagle(str(first), model)
    assert imported.layout.own_embedding
    second = tmp_path / "second"
    export_eagle3(imported, str(second), fmt, target=model, verifier="tiny/target")
    again = read(str(second / weights))
    assert sorted(again) == sorted(state)
    for name in state:
        assert torch.equal(again[name], state[name]), name
    assert json.loads((second / "config.json").read_text()) == json.loads((first / "config.json").read_text())


def test_layouts_name_their_tensors_as_their_loaders_do(tmp_path):
    model = target_model()
    layers = (1, 3, 6)                       # not the default: recorded by speculators and SGLang
    drafter = drafter_for(model, layers=layers)
    for fmt in ("speculators", "sglang"):
        export_eagle3(drafter, str(tmp_path / fmt), fmt, target=model, verifier="tiny/target")
    ours = load_file(str(tmp_path / "speculators" / "model.safetensors"))
    theirs = load_file(str(tmp_path / "sglang" / "model.safetensors"))
    assert {n for n in ours if n.startswith("layers.0.")} and not any(n.startswith("midlayer") for n in ours)
    assert {n.replace("layers.0.", "midlayer.") for n in ours} == set(theirs)
    assert ours["lm_head.weight"].shape == (len(DRAFT_VOCAB), 32) and ours["d2t"].dtype == torch.int64
    assert (torch.arange(len(DRAFT_VOCAB)) + ours["d2t"]).tolist() == DRAFT_VOCAB
    assert ours["t2d"].dtype == torch.bool and ours["t2d"].nonzero().flatten().tolist() == DRAFT_VOCAB
    config = json.loads((tmp_path / "speculators" / "config.json").read_text())
    spec = config["speculators_config"]
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == len(DRAFT_VOCAB)
    assert config["eagle_aux_hidden_state_layer_ids"] == list(layers)
    assert spec["proposal_methods"][0]["speculative_tokens"] >= 1 and spec["verifier"]["name_or_path"] == "tiny/target"
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == spec["proposal_methods"][0]["proposal_type"]
    sglang = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert sglang["architectures"] == ["LlamaForCausalLMEagle3"] and sglang["num_hidden_layers"] == 1
    # SGLang names captured layers by the layer whose output is read (hidden_states index - 1)
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in layers]
    assert load_eagle(str(tmp_path / "sglang"), model).layout.feature_layers == layers


def test_our_checkpoint_of_a_reduced_vocabulary_drafter(tmp_path):
    model = target_model()
    drafter = drafter_for(model)
    save_eagle(str(tmp_path), drafter, model)
    loaded = load_eagle(str(tmp_path), model)
    assert loaded.draft_vocab.tolist() == DRAFT_VOCAB
    assert drafts(model, loaded) == drafts(model, drafter)
    logits = logits_of(loaded, model)
    off = torch.ones(model.config.vocab_size, dtype=torch.bool)
    off[DRAFT_VOCAB] = False
    assert torch.isinf(logits[..., off]).all() and torch.isfinite(logits[..., ~off]).all()


def _spec_folder(tmp_path, model, edit=None, state_edit=None):
    drafter = drafter_for(model)
    folder = tmp_path / "spec"
    export_eagle3(drafter, str(folder), "speculators", target=model, verifier="tiny/target")
    if edit:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    if state_edit:
        state = load_file(str(folder / "model.safetensors"))
        state_edit(state)
        save_file(state, str(folder / "model.safetensors"))
    return str(folder)


def test_what_does_not_fit_is_a_clear_error(tmp_path):
    model = target_model()
    folder = _spec_folder(tmp_path, model)
    with pytest.raises(IncompatibleModelsError, match="hidden size 32.*64"):
        load_eagle(folder, tiny_model("llama", seed=1, layers=8, hidden=64))
    with pytest.raises(IncompatibleModelsError, match="vocabulary of 96"):
        load_eagle(folder, tiny_model("llama", seed=1, layers=8, vocab=80))
    with pytest.raises(IncompatibleModelsError, match="reads target layers"):
        load_eagle(folder, tiny_model("llama", seed=1, layers=4, sharpen=4.0))

    def layer(key, value):
        return lambda c: c["transformer_layer_config"].__setitem__(key, value)
    cases = [
        (dict(edit=layer("model_type", "qwen3")), "'qwen3' layer"),
        (dict(edit=layer("num_hidden_layers", 2)), "2 decoder layers"),
        (dict(edit=lambda c: c.__setitem__("speculators_model_type", "mlp")), "eagle3 speculators only"),
        (dict(state_edit=lambda s: s.pop("fc.weight")), r"\['fc.weight'\] missing"),
        (dict(state_edit=lambda s: s.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(1))), "not part of"),
        (dict(state_edit=lambda s: s.__setitem__("lm_head.weight", torch.zeros(3, 32))), "lm_head.weight has shape"),
        (dict(state_edit=lambda s: s["d2t"].__setitem__(1, -1)), "two draft ids to one target id"),
        (dict(state_edit=lambda s: s["d2t"].zero_()), "t2d does not mark"),
    ]
    for i, (edits, message) in enumerate(cases):
        with pytest.raises(ModelLoadError, match=message):
            load_eagle(_spec_folder(tmp_path / str(i), model, **edits), model)
    corrupt = _spec_folder(tmp_path / "corrupt", model)
    with open(os.path.join(corrupt, "model.safetensors"), "r+b") as f:
        f.truncate(64)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_eagle(corrupt, model)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="no eagle.json"):
        import_eagle3(str(tmp_path / "empty"), model)


def test_exports_refused_with_the_reason(tmp_path):
    model = target_model()
    with pytest.raises(ConfigError, match="EAGLE-1 drafter"):
        export_eagle3(random_drafter(model), str(tmp_path / "a"), "speculators", target=model, verifier="x")
    drafter = drafter_for(model)
    with pytest.raises(ConfigError, match="--verifier"):
        export_eagle3(drafter, str(tmp_path / "b"), "speculators", target=model)
    with pytest.raises(ConfigError, match="--target"):
        export_eagle3(drafter, str(tmp_path / "c"), "sglang")
    with pytest.raises(ConfigError, match="layers 2, L/2, L - 3"):
        export_eagle3(drafter_for(model, layers=(1, 3, 6)), str(tmp_path / "d"), "eagle", target=model)
    with pytest.raises(ConfigError, match="formats"):
        export_eagle3(drafter, str(tmp_path / "e"), "vllm", target=model)


def test_export_command(tmp_path):
    from specdec.cli import main
    model = target_model()
    model.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    save_eagle(str(tmp_path / "ours"), drafter_for(model), model)
    assert main(["export", "eagle", str(tmp_path / "ours"), "--format", "speculators", "--out", str(tmp_path / "out"),
                 "--target", str(tmp_path / "target"), "--speculative-tokens", "5"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(tmp_path / "target")
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    import specdec
    sd = specdec.load("eagle", **{"target.path": str(tmp_path / "target"), "eagle.path": str(tmp_path / "out"),
                                  "device": "cpu"})
    assert isinstance(sd.strategy.drafter, Eagle3Drafter)
    out = sd.generate(PROMPT, max_new_tokens=8, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, 8, min_new_tokens=8)


# ---------------------------------------------------------------------- against the loaders' key lists
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "interop", "eagle3_keys.json")


def _shape(formula, symbols: dict) -> tuple[int, ...] | None:
    """'[H, A*Ht] (note)' -> the shape with symbols' values (None: not a shape formula)."""
    text = formula["shape"] if isinstance(formula, dict) else formula
    if not isinstance(text, str) or not text.startswith("["):
        return None
    dims = text[1: text.index("]")].split(",")
    return tuple(int(eval(d, {"__builtins__": {}}, symbols)) for d in dims)    # noqa: S307 - fixture arithmetic


def _optional(formula) -> bool:
    text = formula if isinstance(formula, str) else formula.get("note", "")
    return "when " in text or "optional" in text or "ignored" in text


def _get(config: dict, path: str):
    value = config
    for part in path.replace("[0]", ".0").split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


@pytest.mark.parametrize("loader,fmt", [("speculators", "speculators"), ("vllm", "speculators"),
                                        ("sglang", "sglang"), ("eagle_repo", "eagle")])
def test_exports_carry_what_each_loader_reads(tmp_path, loader, fmt):
    """tests/fixtures/interop/eagle3_keys.json lists, from each loader's source (speculators 0.9.0 and
    vLLM 0.33.0 wheels, SGLang 0.5.23, SafeAILab/EAGLE), the tensors and config keys it reads: our
    export has every required tensor under that name (SGLang maps midlayer to layers.0), with that
    shape, and every required config key."""
    spec = json.load(open(FIXTURE))["loaders"][loader]
    model = target_model()
    drafter = drafter_for(model)
    export_eagle3(drafter, str(tmp_path), fmt, target=model, verifier="org/tiny-target")
    state = (torch.load(str(tmp_path / "pytorch_model.bin"), weights_only=True) if fmt == "eagle"
             else load_file(str(tmp_path / "model.safetensors")))
    if loader == "sglang":
        state = {name.replace("midlayer.", "layers.0."): t for name, t in state.items()}
    layout = drafter.layout
    symbols = {"H": layout.width, "Ht": layout.hidden_size, "V": layout.vocab_size, "N": layout.draft_vocab_size,
               "I": layout.intermediate_size, "A": len(layout.feature_layers), "heads": layout.num_heads,
               "kv_heads": layout.num_kv_heads, "head_dim": layout.head_dim}
    checked = 0
    for name, formula in spec["tensors"].items():
        if name == "note" or "{" in name or name == "t2d" and loader in ("vllm", "sglang"):
            continue
        if _optional(formula) and name not in state:
            continue
        assert name in state, f"{loader} reads {name}: not in our {fmt} export ({sorted(state)})"
        shape = _shape(formula, symbols)
        if shape is not None:
            assert tuple(state[name].shape) == shape, (name, tuple(state[name].shape), shape)
            checked += 1
    assert checked >= 14
    config = json.loads((tmp_path / "config.json").read_text())
    for key, want in spec["config_required"].items():
        if key == "detection":                     # vLLM: speculators_config and no top-level model_type
            assert "speculators_config" in config and "model_type" not in config
        elif key != "format":
            value = _get(config, key)
            if isinstance(want, list) or isinstance(want, bool):
                assert value == want, (key, value, want)
    if loader == "vllm":                           # vLLM defaults an absent norm_before_residual to True
        assert config["norm_before_residual"] is False
    if loader == "eagle_repo":
        assert config["draft_vocab_size"] == layout.draft_vocab_size and config["num_hidden_layers"] == 1
