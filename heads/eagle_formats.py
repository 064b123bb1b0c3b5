"""EAGLE-3 drafters in the layouts other tools read and write (the module: specdec.heads.eagle3).

* `speculators` - vLLM's format (`vllm serve DIR` reads it): `config.json` with
  `speculators_model_type: eagle3`, `transformer_layer_config` (the drafter layer's Llama
  config), `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids` (indices of the target layers
  whose *input* is captured: Hugging Face `hidden_states` indices), `norm_before_residual` and
  friends, `speculators_config` (algorithm, proposal methods, verifier); `model.safetensors` with
  `fc`, `layers.0.*`, `norm`, `lm_head`, `d2t`, `t2d`, optional `embed_tokens`.
* `eagle` / `sglang` - the EAGLE repository's layout, which SGLang's `LlamaForCausalLMEagle3`
  loads: a plain Llama `config.json` (one layer) with `draft_vocab_size`, weights under the same
  names except layer 0, which is `midlayer.*`; the EAGLE repository saves `pytorch_model.bin`,
  our sglang export `model.safetensors`. Neither records the captured layers: they are the
  target's layers 2, L/2 and L - 3 (SGLang reads other ones from `eagle_config`, as ids of
  layers whose *output* is captured: hidden_states index - 1).

d2t holds offsets (target id = draft id + d2t[draft id]) in every layout; t2d is a boolean mask
over the target vocabulary. None of these layouts records which exact target a drafter was
trained on, so an imported drafter is checked against the target by shape only.
"""
from __future__ import annotations

import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.atomic import atomic_write, atomic_write_json
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.interop.files import read_json
from specdec.models import output_vocab_size

from .eagle import eagle3_layers
from .eagle3 import Eagle3Drafter, Eagle3Layout

FORMATS = ("speculators", "eagle", "sglang")
SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"
MIDLAYER, LAYER0 = "midlayer.", "layers.0."
TRAINING_ONLY = ("verifier_lm_head.weight", "verifier_norm.weight")
SPECULATORS_VERSION = "0.9.0"       # the release our exports were checked against (scripts/interop)


# ---------------------------------------------------------------------- reading files
def _load_weights(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (or of pytorch_model.bin)."""
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    state: dict[str, torch.Tensor] = {}
    try:
        for name in files:
            state.update(load_file(os.path.join(folder, name)))
        if not files and os.path.isfile(os.path.join(folder, TORCH_BIN)):
            loaded = torch.load(os.path.join(folder, TORCH_BIN), map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict):
                raise ModelLoadError(f"{folder}/{TORCH_BIN} does not hold a state dict")
            state.update(loaded)
    except (SafetensorError, OSError, RuntimeError, ValueError, EOFError) as exc:
        raise ModelLoadError(f"the weights in {folder!r} are corrupt or truncated ({exc})") from exc
    if not state:
        raise ModelLoadError(f"{folder!r} has a config.json but no weights (*.safetensors or {TORCH_BIN})")
    return state


def detect_eagle_format(folder: str) -> str | None:
    """"speculators" or "eagle" (the EAGLE repository's / SGLang's layout), None when it is neither."""
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        return None
    config = read_json(config_path)
    if config.get("speculators_model_type") is not None or "speculators_config" in config:
        return "speculators"
    if "draft_vocab_size" in config or any("Eagle3" in a for a in config.get("architectures") or []):
        return "eagle"
    return None


# ---------------------------------------------------------------------- config -> layout
def _layer_config(config: dict, where: str) -> dict:
    """The drafter layer's Llama config; refuses what our module does not run."""
    layer = config.get("transformer_layer_config", config)
    if not isinstance(layer, dict):
        raise ModelLoadError(f"{where}: transformer_layer_config is not a JSON object")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise ModelLoadError(f"{where}: the drafter's decoder layer is a {model_type!r} layer; specdec runs EAGLE-3 "
                             f"drafters with a Llama layer (model_type llama) only")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ModelLoadError(f"{where}: {layer['num_hidden_layers']} decoder layers; specdec runs one-layer EAGLE-3 "
                             f"drafters only")
    if layer.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: hidden_act {layer['hidden_act']!r}; specdec's EAGLE-3 layer is SwiGLU (silu)")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if key not in layer:
            raise ModelLoadError(f"{where}: the layer config has no {key!r}")
    return layer


def _rope(layer: dict) -> tuple[float, dict | None]:
    rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", None) or layer.get("rope_theta") or 10000.0)
    if rope.get("rope_type", rope.get("type")) in (None, "default"):
        rope.pop("rope_type", None)
        rope.pop("type", None)
    return theta, rope or None


def layout_from_config(config: dict, kind: str, target, where: str, own_embedding: bool) -> Eagle3Layout:
    layer = _layer_config(config, where)
    hidden = int(layer["hidden_size"])
    heads = int(layer["num_attention_heads"])
    target_hidden = int(config.get("target_hidden_size") or hidden)
    layer_ids = config.get("eagle_aux_hidden_state_layer_ids") if kind == "speculators" else None
    if kind == "eagle" and isinstance(config.get("eagle_config"), dict):
        ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        layer_ids = [int(i) + 1 for i in ids] if ids else None          # SGLang: outputs of these layers
    if layer_ids is None:
        if target is None:
            raise ModelLoadError(f"{where} does not name the target layers it reads (the default is the target's "
                                 f"layers 2, L/2, L - 3): load it with its target")
        layer_ids = eagle3_layers(int(target.config.num_hidden_layers))
    theta, scaling = _rope(layer)
    vocab = int(layer["vocab_size"])
    flags = {name: bool(config.get(name, False)) for name in ("norm_before_residual", "norm_before_fc", "fc_norm",
                                                                 "norm_output")}
    return Eagle3Layout(
        hidden_size=target_hidden, vocab_size=vocab, draft_vocab_size=int(config.get("draft_vocab_size") or vocab),
        num_heads=heads, num_kv_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or hidden // heads), intermediate_size=int(layer["intermediate_size"]),
        feature_layers=tuple(int(i) for i in layer_ids), draft_hidden_size=hidden if hidden != target_hidden else None,
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings") or 2048),
        norm_eps=float(layer.get("rms_norm_eps") or 1e-6), attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)), own_embedding=own_embedding, **flags)


def check_fits(layout: Eagle3Layout, target, where: str) -> None:
    """IncompatibleModelsError when the drafter was made for a target of another shape."""
    hidden, vocab = int(target.config.hidden_size), output_vocab_size(target)
    layers = int(target.config.num_hidden_layers)
    if layout.hidden_size != hidden:
        raise IncompatibleModelsError(f"{where}: made for a target of hidden size {layout.hidden_size}, but this "
                                      f"target's is {hidden}: load the drafter with the target it was trained for")
    if layout.vocab_size != vocab:
        raise IncompatibleModelsError(f"{where}: made for a target vocabulary of {layout.vocab_size} tokens, but this "
                                      f"target's is {vocab}: load the drafter with the target it was trained for")
    bad = [i for i in layout.feature_layers if not -layers - 1 <= i <= layers]
    if bad:
        raise IncompatibleModelsError(f"{where}: reads target layers {list(layout.feature_layers)}, but this target "
                                      f"has hidden states 0..{layers}: load it with the target it was trained for")


# ---------------------------------------------------------------------- import
def import_eagle3(folder: str, target=None) -> Eagle3Drafter:
    """The EAGLE-3 drafter of a speculators or EAGLE-repository folder, checked against `target`
    (shape) when given. A saved embed_tokens equal to the target's is dropped (the target's is read)."""
    kind = detect_eagle_format(folder)
    if kind is None:
        raise ModelLoadError(f"EAGLE drafter folder {folder!r} has no eagle.json, and no config.json of a "
                             f"speculators or EAGLE-repository EAGLE-3 checkpoint: give eagle.path= a folder "
                             f"written by `specdec train-heads train_eagle`, `specdec export eagle`, speculators or "
                             f"the EAGLE repository")
    where = f"the {kind} EAGLE-3 checkpoint in {folder!r}"
    config = read_json(os.path.join(folder, "config.json"))
    if kind == "speculators" and config.get("speculators_model_type") != "eagle3":
        raise ModelLoadError(f"{where}: speculators_model_type is {config.get('speculators_model_type')!r}; "
                             f"specdec's eagle strategy runs eagle3 speculators only")
    state = {(LAYER0 + name[len(MIDLAYER):] if name.startswith(MIDLAYER) else name): t
             for name, t in _load_weights(folder).items() if name not in TRAINING_ONLY}
    embedding = state.pop("embed_tokens.weight", None)
    own = embedding is not None and not _same_embedding(embedding, target)
    layout = layout_from_config(config, kind, target, where, own_embedding=own)
    if target is not None:
        check_fits(layout, target, where)
    if embedding is None and layout.width != layout.hidden_size:
        raise ModelLoadError(f"{where}: no embed_tokens, and the drafter's width ({layout.width}) is not the target's "
                             f"({layout.hidden_size}), so it cannot read the target's embedding")
    if own:
        state["embed_tokens.weight"] = embedding
    drafter = Eagle3Drafter(layout)
    if "d2t" not in state and not layout.reduced_vocab:      # a full vocabulary needs no mapping
        state["d2t"], state["t2d"] = drafter.d2t.clone(), drafter.t2d.clone()
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"{where}: tensor(s) {missing} missing: is it a complete EAGLE-3 checkpoint?")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ModelLoadError(f"{where}: tensor(s) {unknown[:6]} are not part of a one-layer Llama EAGLE-3 drafter "
                             f"(specdec runs that module only)")
    for name, tensor in expected.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{where}: {name} has shape {tuple(state[name].shape)}, its config implies "
                                 f"{tuple(tensor.shape)}")
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    drafter.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
    try:
        drafter.check_vocab()
    except ValueError as exc:
        raise ModelLoadError(f"{where}: {exc}") from exc
    return drafter


def _same_embedding(embedding: torch.Tensor, target) -> bool:
    if target is None:
        return False
    theirs = target.get_input_embeddings().weight
    return tuple(theirs.shape) == tuple(embedding.shape) and torch.allclose(
        theirs.detach().float().cpu(), embedding.float(), rtol=1e-2, atol=1e-3)


# ---------------------------------------------------------------------- export
def _layer_config_dict(layout: Eagle3Layout) -> dict:
    """The drafter layer's Llama config as every loader reads it: the fields spelled out, rope both
    as transformers 5 writes it (rope_parameters) and as older readers do (rope_theta, rope_scaling)."""
    scaling = dict(layout.rope_scaling) if layout.rope_scaling else None
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": layout.width, "intermediate_size": layout.intermediate_size,
        "num_attention_heads": layout.num_heads, "num_key_value_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim, "num_hidden_layers": 1, "vocab_size": layout.vocab_size,
        "rms_norm_eps": layout.norm_eps, "max_position_embeddings": layout.max_position_embeddings,
        "attention_bias": layout.attention_bias, "mlp_bias": layout.mlp_bias, "tie_word_embeddings": False,
        "rope_theta": layout.rope_theta, "rope_scaling": scaling,
        "rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": layout.rope_theta},
    }


def export_eagle3(drafter: Eagle3Drafter, out: str, fmt: str, target=None, verifier: str | None = None,
                  speculative_tokens: int = 3) -> str:
    """Write `drafter` to `out` in `fmt` (speculators | eagle | sglang). The target's input embedding
    is written as embed_tokens (every loader reads it from the drafter's file or resolves it from
    the verifier); `verifier` (speculators: speculators_config.verifier.name_or_path, which vLLM
    loads as the target) is the target's name or folder."""
    if fmt not in FORMATS:
        raise ConfigError(f"EAGLE-3 export formats: {', '.join(FORMATS)}; not {fmt!r}")
    if not isinstance(drafter, Eagle3Drafter):
        raise ConfigError("only a standard EAGLE-3 drafter exports (train with layout=eagle3); this one is an "
                          "EAGLE-1 drafter (specdec.heads.eagle), which no other tool runs")
    layout = drafter.layout
    state = {name: t.detach().cpu().contiguous() for name, t in drafter.state_dict().items()}
    if "embed_tokens.weight" not in state:
        if target is None:
            raise ConfigError("the drafter reads the target's embedding: give the target (--target) so it is written "
                              "out as embed_tokens")
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float().cpu().contiguous()
    if fmt == "speculators":
        if verifier is None:
            raise ConfigError("a speculators export names its verifier (the target vLLM loads): give --verifier "
                              "NAME_OR_PATH (or --target)")
        config = speculators_config(layout, verifier, speculative_tokens)
    else:
        extra = [name for name in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
                 if getattr(layout, name)]
        if extra:
            raise ConfigError(f"the {fmt} layout has no {', '.join(extra)}: export this drafter as speculators")
        if fmt == "eagle" and layout.head_dim * layout.num_heads != layout.width:
            raise ConfigError(f"the EAGLE repository's layer has head_dim = hidden / heads; this drafter's is "
                              f"{layout.head_dim} (x {layout.num_heads} heads != {layout.width}): export it as sglang "
                              f"or speculators")
        if fmt == "eagle" and layout.rope_scaling and (layout.rope_scaling.get("rope_type")
                                                       or layout.rope_scaling.get("type")) not in ("linear", "dynamic"):
            raise ConfigError(f"the EAGLE repository reads linear or dynamic rope scaling only, not "
                              f"{layout.rope_scaling}: export it as sglang or speculators")
        state = {(MIDLAYER + name[len(LAYER0):] if name.startswith(LAYER0) else name): t for name, t in state.items()}
        config = {**_layer_config_dict(layout), "architectures": ["LlamaForCausalLMEagle3"],
                  "draft_vocab_size": layout.draft_vocab_size}
        if layout.width != layout.hidden_size:
            config["target_hidden_size"] = layout.hidden_size
        if target is not None and tuple(layout.feature_layers) != eagle3_layers(int(target.config.num_hidden_layers)):
            if fmt == "eagle":
                raise ConfigError(f"the EAGLE repository reads the target's layers 2, L/2, L - 3 only; this drafter "
                                  f"reads {list(layout.feature_layers)}: export it as sglang or speculators")
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layout.feature_layers]}
    os.makedirs(out, exist_ok=True)
    if fmt == "eagle":
        atomic_write(os.path.join(out, TORCH_BIN), lambda tmp: torch.save(state, tmp))
    else:
        atomic_write(os.path.join(out, SAFETENSORS), lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    atomic_write_json(os.path.join(out, "config.json"), config, indent=2)
    return out


def speculators_config(layout: Eagle3Layout, verifier: str, speculative_tokens: int) -> dict:
    """config.json of a speculators EAGLE-3 checkpoint (the keys vLLM's speculators loader reads)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _layer_config_dict(layout),
        "draft_vocab_size": layout.draft_vocab_size,
        "norm_before_residual": layout.norm_before_residual,
        "norm_before_fc": layout.norm_before_fc,
        "fc_norm": layout.fc_norm,
        "norm_output": layout.norm_output,
        "target_hidden_size": layout.hidden_size if layout.width != layout.hidden_size else None,
        "eagle_aux_hidden_state_layer_ids": list(layout.feature_layers),
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
