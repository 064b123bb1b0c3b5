"""Loading Hugging Face models and tokenizers, with errors that say what to do."""
from __future__ import annotations

import copy
import functools
import inspect
import os
from dataclasses import dataclass

import torch

from .errors import IncompatibleModelsError, ModelLoadError
from .tree import tree_attention_mask, tree_position_ids

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 dot products (oneDNN's check: AVX512-BF16 or AMX). Without them
    bfloat16 matrix products are emulated, many times slower than float32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 natively: CUDA with bf16 support, or a CPU with bf16 dot
    products (elsewhere bf16 is emulated or unsupported: never faster than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_bf16()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device={device!r} asked for CUDA, but torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}); use device=cpu or install a CUDA build of torch")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return DTYPES[dtype]


def _check_model_dir(path: str, role: str, key: str) -> None:
    if not path:
        raise ModelLoadError(f"no {role} model given: set {key}=/path/to/a/huggingface/checkpoint")
    if not os.path.isdir(path):
        raise ModelLoadError(f"{role} model path {path!r} does not exist or is not a folder: give {key}= "
                             f"the folder of a Hugging Face checkpoint (config.json + weights); nothing is "
                             f"downloaded from a model hub")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelLoadError(f"{role} model folder {path!r} has no config.json: is it a Hugging Face checkpoint? "
                             f"Give {key}= the folder that holds config.json and the weights")


def load_model(path: str, role: str, device: torch.device, dtype: torch.dtype, key: str | None = None):
    """`key`: the key the calling command takes for this folder, named in hints (default "<role>.path",
    a generation config's; the training commands take `target=`, the bench `models.target=`)."""
    from transformers import AutoModelForCausalLM
    _check_model_dir(path, role, key or f"{role}.path")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised with the path and a hint
        raise ModelLoadError(f"could not load the {role} model from {path!r}: {exc}") from exc
    return model.to(device).eval()


def load_tokenizer(path: str, role: str = "target", key: str | None = None):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"could not load a tokenizer from {path!r} ({role}): {exc}. "
                             f"Put the tokenizer files in the model folder or set {key or role + '.tokenizer'}=PATH") from exc


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_class) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_keyword(model) -> str:
    """The keyword the model's forward takes its KV cache by: `cache` where Transformers has renamed
    it (there `past_key_values` is deprecated and warns on every forward), `past_key_values` before."""
    return _cache_keyword(type(model))


def cache_kwargs(model, cache) -> dict:
    """{cache_keyword(model): cache}, for a forward call (eager code: a compiled forward looks the
    keyword up once, outside the trace)."""
    return {_cache_keyword(type(model)): cache}


def output_vocab_size(model) -> int:
    """Width of the model's logits."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return head.weight.shape[0]
    return model.config.vocab_size


def context_length(model, tokenizer=None) -> int | None:
    """The longest sequence the model takes (positions), when it says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_vocab: int, draft_vocab: int) -> None:
    """A draft must speak the target's token ids: same vocabulary (when both tokenizers are
    known), and logits wide enough to cover every token the tokenizer has."""
    if target_tokenizer is not None and draft_tokenizer is not None:
        target_v, draft_v = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if target_v != draft_v:
            diff = sorted(set(target_v.items()) ^ set(draft_v.items()))[:3]
            raise IncompatibleModelsError(
                f"the draft's tokenizer differs from the target's ({len(draft_v)} vs {len(target_v)} tokens; "
                f"first differences: {diff}): speculative decoding needs the same token ids. "
                f"Use a draft trained with the target's tokenizer")
    n_tokens = len(target_tokenizer) if target_tokenizer is not None else target_vocab
    if draft_vocab < n_tokens:
        raise IncompatibleModelsError(
            f"the draft's logits cover {draft_vocab} tokens but the target's tokenizer has {n_tokens}: "
            f"use a draft trained with the target's tokenizer")


# ---------------------------------------------------------------------- attention layout
# Attention implementations whose kernels take an arbitrary additive 4-D mask, so a tree forward
# is exact (flash-attention kernels only know "causal", and would silently ignore the tree).
TREE_ATTENTION = ("sdpa", "eager", "flex_attention")
# Layer kinds whose KV we can keep in full and commit, the window being applied by the mask.
TREE_LAYER_TYPES = ("full_attention", "sliding_attention")
# Layer kinds that keep a recurrent state (Hugging Face's LinearAttentionLayer: Qwen3-Next's gated delta
# rule), which a target may have: no tree can be verified through them, since one state cannot hold two
# branches, and a rejected draft's update cannot be undone; the verifier checks chains on such a target and
# rolls the state back by keeping it from before the forward (specdec.verifier)
RECURRENT_LAYER_TYPES = ("linear_attention",)


@dataclass(frozen=True)
class AttentionLayout:
    """What a tree mask must know of how the model's layers attend."""
    layer_types: tuple[str, ...]            # per decoder layer, Hugging Face's names
    windows: dict                           # layer type -> sliding window (None = plain causal)
    by_type: bool                           # forward takes attention_mask={layer type: 4-D mask}
    recurrent: bool = False                 # some layers keep a recurrent state: chains only (RECURRENT_LAYER_TYPES)


def decoder_layer_types(model) -> tuple[list[str], list[dict]]:
    """Hugging Face's own reading of the decoder's layer kinds ("full_attention",
    "sliding_attention", "chunked_attention", ...) and per-layer cache arguments (the window)."""
    config = model.config.get_text_config(decoder=True)
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:      # older transformers: layer_types, else one kind for every layer
        layers = config.num_hidden_layers
        window = getattr(config, "sliding_window", None)
        types = list(getattr(config, "layer_types", None)
                     or ["sliding_attention" if window else "full_attention"] * layers)
        return types, [{"sliding_window": window} if t == "sliding_attention" else {} for t in types]
    return get_layer_types_and_kwargs(config)


def recurrent_layer_kinds(model) -> list[str]:
    """The decoder's layer kinds that keep a recurrent state (RECURRENT_LAYER_TYPES), sorted; [] for none."""
    types, _ = decoder_layer_types(model)
    return sorted(set(types) & set(RECURRENT_LAYER_TYPES))


def verified_on_chains(model) -> bool:
    """Whether specdec verifies only chains on this target: one recurrent state (a linear-attention layer's)
    follows one path, so a planner sizes chains on it and a strategy that can draft one path drafts one."""
    return bool(recurrent_layer_kinds(model))


def check_cacheable(model, role: str = "draft", recurrent: bool = False) -> list[str]:
    """The decoder's layer types, when every layer is one whose KV specdec can commit (or, with
    recurrent, one that keeps a recurrent state: a target verified on chains); else a clear error."""
    types, _ = decoder_layer_types(model)
    allowed = TREE_LAYER_TYPES + (RECURRENT_LAYER_TYPES if recurrent else ())
    bad = sorted(set(types) - set(allowed))
    if bad:
        verifies, unsupported = (("verifies", "chunked and KV-sharing") if recurrent else
                                 ("verifies trees", "chunked, linear-attention and KV-sharing"))
        raise IncompatibleModelsError(
            f"the {role} model ({type(model).__name__}) has {bad[0]!r} layers: specdec {verifies} on "
            f"layers of kinds {', '.join(allowed)} only ({unsupported} "
            f"layers are not supported yet); use a model without them, or plain model.generate()")
    return types


def attention_layout(model) -> AttentionLayout:
    """How the target attends, checked: an attention implementation that applies a 4-D tree mask,
    and layer kinds whose window the mask can carry. Anything else is refused here, at load time,
    rather than verified silently wrong."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in TREE_ATTENTION:
        raise IncompatibleModelsError(
            f"the target was loaded with attn_implementation={impl!r}, whose kernels cannot apply a tree "
            f"attention mask (it would verify trees silently wrong): load it with "
            f"attn_implementation=\"sdpa\" (or \"eager\"), or call model.set_attn_implementation(\"sdpa\")")
    types = check_cacheable(model, "target", recurrent=True)
    if set(types) & set(RECURRENT_LAYER_TYPES):
        return AttentionLayout(tuple(types), {t: None for t in types}, False, recurrent=True)
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    _, per_layer = decoder_layer_types(model)
    layer_windows = {kw.get("sliding_window") for t, kw in zip(types, per_layer) if t == "sliding_attention"}
    if "sliding_attention" in types and layer_windows != {window}:
        raise IncompatibleModelsError(
            f"the target's sliding layers use windows {sorted(layer_windows)} but its config says "
            f"sliding_window={window}: specdec needs one window for all sliding layers")
    windows = {t: (window if t == "sliding_attention" else None) for t in types}
    by_type = len(set(types)) > 1
    if by_type and not _takes_mask_per_type(model):
        raise IncompatibleModelsError(
            f"the target ({type(model).__name__}) mixes {' and '.join(sorted(set(types)))} layers but its "
            f"forward does not take one attention mask per layer type: specdec cannot give its layers "
            f"their windows in a tree forward")
    layout = AttentionLayout(tuple(types), windows, by_type)
    check_tree_forward(model, layout)
    check_own_window(model, layout)
    return layout


def check_causal(model, role: str = "target") -> None:
    """Refuse an encoder loaded without is_decoder=True (BERT, RoBERTa, ... with a causal-LM head):
    its attention sees both ways, so a token's KV depends on the tokens after it. Read from the
    self-attention modules' own `is_causal` (config.is_decoder is False on causal LMs too)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model     # not a vision / audio tower
    both_ways = [m for m in (decoder or model).modules() if getattr(m, "is_causal", True) is False
                 and not getattr(m, "is_cross_attention", False)]
    if both_ways:
        raise IncompatibleModelsError(
            f"the {role} model ({type(model).__name__}) attends both ways ({type(both_ways[0]).__name__}."
            f"is_causal is False; for an encoder: loaded with is_decoder=False): its attention sees "
            f"both ways, which no KV cache can reproduce token by token. Load it as a decoder "
            f"(from_pretrained(..., is_decoder=True)) or use a causal LM")


@torch.inference_mode()
def check_tree_forward(model, layout: AttentionLayout) -> None:
    """Run the smallest tree (two siblings under one token) through the model with the tree's 4-D
    mask and position ids, and compare the second sibling's logits with a plain forward over its
    own path. Models that build attention biases from a 2-D mask (ALiBi in BLOOM), reshape the mask
    themselves (OpenAI GPT, XLM) or ignore it would otherwise raise deep inside transformers or,
    worse, verify trees silently wrong. Compared in fp32 only (lower precisions differ in rounding).
    Called through model.forward: forward hooks on the model (a benchmark's forward meter) do not
    see this probe."""
    check_causal(model)
    vocab = model.get_input_embeddings().num_embeddings
    tokens = [min(i, vocab - 1) for i in (3, 4, 5)]
    parents = (-1, 0, 0)                          # token 0, then two children of it
    device = model.device
    ids = torch.tensor([tokens], device=device)
    masks = {w: _tree_mask(parents, model.dtype, device, w) for w in set(layout.windows.values())}
    mask = {t: masks[w] for t, w in layout.windows.items()} if layout.by_type else next(iter(masks.values()))
    what = (f"the target ({type(model).__name__}, model_type {model.config.model_type!r}) cannot verify a tree "
            f"of candidates in one forward")
    try:
        tree_logits = model.forward(input_ids=ids, attention_mask=mask, position_ids=tree_position_ids(parents, 0, device),
                                    use_cache=False).logits[0, 2]
    except Exception as exc:  # noqa: BLE001 - re-raised as what the model lacks
        raise IncompatibleModelsError(
            f"{what}: its forward does not take a 4-D attention mask with position ids "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); use plain model.generate()") from exc
    path_ids = torch.tensor([[tokens[0], tokens[2]]], device=device)
    path_logits = model.forward(input_ids=path_ids, attention_mask=torch.ones_like(path_ids),   # as generate() calls it
                                position_ids=torch.arange(2, device=device)[None], use_cache=False).logits[0, 1]
    finite = bool(torch.isfinite(tree_logits).all() and torch.isfinite(path_logits).all())   # NaN: a kernel that
    # cannot run here (compiled flex attention on a CPU), refused with its own message where it is used
    if finite and model.dtype == torch.float32 and not torch.allclose(tree_logits.float(), path_logits.float(),
                                                           atol=1e-3, rtol=1e-3):
        raise IncompatibleModelsError(
            f"{what}: with a tree's 4-D attention mask and position ids its logits differ from a plain forward "
            f"over the same path (by {float((tree_logits - path_logits).abs().max()):.3g}), so it ignores the "
            f"mask or the positions; use plain model.generate()")


def check_own_window(model, layout: AttentionLayout) -> None:
    """A sliding-window model must apply its window in its own attention mask: specdec keeps every
    entry in the cache and lets chains (and prefills) use the model's own masks. A model whose
    window lives only in Hugging Face's cache (old entries dropped, the mask unwindowed: moshi)
    attends differently with and without a cache, so no speculative run can match generate():
    refused. Probed in fp32 over a sequence longer than the window."""
    sized = {w for w in layout.windows.values() if w is not None}
    if not sized or model.dtype != torch.float32:
        return
    window = min(sized)
    vocab = model.get_input_embeddings().num_embeddings
    length = window + 3
    ids = (torch.arange(length, device=model.device)[None] * 7 + 3) % vocab                # [1, L]
    positions = torch.arange(length, device=model.device)[None]
    parents = tuple(range(-1, length - 1))                                                 # a chain
    masks = {w: _tree_mask(parents, model.dtype, model.device, w) for w in set(layout.windows.values())}
    mask = {t: masks[w] for t, w in layout.windows.items()} if layout.by_type else next(iter(masks.values()))
    own = model.forward(input_ids=ids, position_ids=positions, use_cache=False).logits[0, -1]
    windowed = model.forward(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[0, -1]
    if torch.isfinite(own).all() and not torch.allclose(own.float(), windowed.float(), atol=1e-3, rtol=1e-3):
        raise IncompatibleModelsError(
            f"the target ({type(model).__name__}, model_type {model.config.model_type!r}) has a sliding window "
            f"of {window} tokens that its own attention mask does not apply (Hugging Face applies it only by "
            f"dropping old cache entries), so it attends differently with and without a cache and no "
            f"speculative run can match its generate(); use plain model.generate()")


def _tree_mask(parents, dtype, device, window):
    return tree_attention_mask(parents, 0, dtype, device, window)


def _takes_mask_per_type(model) -> bool:
    """Whether the decoder's forward accepts attention_mask={layer type: mask} (Hugging Face's
    `causal_mask_mapping` convention of models with layer_types)."""
    try:
        source = inspect.getsource(type(model.base_model).forward)
    except (OSError, TypeError):
        return False
    config = model.config.get_text_config(decoder=True)
    return "causal_mask_mapping" in source and "dict" in source and getattr(config, "layer_types", None) is not None


def shallow_module(module: nn.Module) -> nn.Module:
    """A copy of `module` that shares its submodules, parameters and buffers but whose own registries
    (submodules, hooks) are new dicts: a change to the copy never reaches the original."""
    twin = copy.copy(module)
    for key, value in vars(module).items():
        if key.startswith("_") and isinstance(value, dict):
            setattr(twin, key, type(value)(value))
    return twin
