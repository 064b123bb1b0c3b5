"""Every decoder-only architecture the installed transformers can build: prompt lookup, a draft
chain and a draft tree must be token-identical to the target's own generate(do_sample=False) in
fp32, or refused up front by specdec with an error that says what the model lacks.

    python scripts/measure/arch_sweep.py [model_type ...]       # all of them by default

Prints a markdown table: architecture | prompt_lookup | draft chain | draft tree | note.
Each architecture is built tiny from its own default config (few layers, small widths, a small
vocabulary, a short sliding window where it has one), fp32, seeded. The draft is a second model of
the same architecture and vocabulary: the target's weights plus Gaussian noise of another seed, so
that drafts are partly accepted (a draft of unrelated random weights is rejected at the first
token, and would leave the tree rows below the root unchecked).
tests/test_arch_sweep.py runs the same check per architecture (slow-marked)."""
from __future__ import annotations

import copy
import inspect
import sys
import warnings
from dataclasses import dataclass, field

import torch

VOCAB = 96
WINDOW = 8                  # sliding windows shrunk below the prompt so trees straddle the edge
NEW_TOKENS = 16
DRAFT_DEPTH = 4
STRATEGIES = ("prompt_lookup", "draft chain", "draft tree")

# Size keys of Hugging Face configs and the tiny value each gets (only keys a config has are set).
SIZES = {
    "vocab_size": VOCAB,
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "dim", "embed_dim", "model_dim"), 64),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "intermediate_size_mlp",
                     "dense_intermediate_size", "shared_intermediate_size", "block_size_ffn"), 64),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
                     "num_key_value_groups"), 2),
    "head_dim": 16, "kv_channels": 16,
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size",
                     "moe_shared_expert_intermediate_size", "ffn_hidden_size_moe"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                     "num_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k_experts", "num_experts_per_token",
                     "moe_k"), 2),
    **dict.fromkeys(("n_group", "topk_group"), 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                     "n_ctx"), 512),
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "rotary_dim": 8,
    **dict.fromkeys(("pad_token_id",), 0), **dict.fromkeys(("bos_token_id",), 1),
    **dict.fromkeys(("eos_token_id",), 2),
}
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
PER_LAYER_TYPES = ("layer_types", "layers_block_type", "block_types", "layer_type")


# ---------------------------------------------------------------------- tiny models
def architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _layer_picks(values: dict) -> tuple[int, list[int] | None]:
    """How many layers to keep and which of the default config's (one of each layer kind, in
    order, at least two layers), from its per-layer type list when it has one."""
    layers = next((values[k] for k in LAYER_KEYS if isinstance(values.get(k), int)), None)
    kinds = next((values[k] for k in PER_LAYER_TYPES if isinstance(values.get(k), list)), None)
    if not layers or not kinds or len(kinds) != layers:
        return 2, None
    picks, seen = [], set()
    for i, kind in enumerate(kinds):
        if kind not in seen:
            seen.add(kind)
            picks.append(i)
    if len(picks) < 2:
        picks = [0, 1] if layers > 1 else [0]
    return len(picks), picks


def shrink(values: dict) -> dict:
    """A tiny copy of a config's dict (sub-configs too): the SIZES, few layers (per-layer lists
    cut to the kept layers), a short sliding window."""
    values = dict(values)
    old_layers = next((values[k] for k in LAYER_KEYS if isinstance(values.get(k), int)), None)
    layers, picks = _layer_picks(values)
    for key, value in list(values.items()):
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            values[key] = shrink(value)
        elif key in SIZES and isinstance(value, int) and not isinstance(value, bool):
            values[key] = SIZES[key] if key not in ("num_experts_per_tok",) else min(value, SIZES[key])
        elif key in LAYER_KEYS and isinstance(value, int):
            values[key] = layers
        elif key == "sliding_window" and isinstance(value, int):
            values[key] = WINDOW
        elif isinstance(value, list) and old_layers and len(value) == old_layers and old_layers > layers:
            values[key] = [value[i] for i in picks] if picks else value[:layers]
    if values.get("is_decoder") is False:       # encoders with a causal-LM head attend causally only as decoders
        values["is_decoder"] = True
    if "kv_lora_rank" in values and "num_key_value_heads" in values:   # latent attention: one KV head per head
        values["num_key_value_heads"] = values.get("num_attention_heads", SIZES["num_attention_heads"])
        values["head_dim"] = values.get("qk_rope_head_dim", values.get("head_dim"))
    for key in ("rope_scaling", "rope_parameters"):      # keep rope defaults sized for the new head_dim
        if isinstance(values.get(key), dict):
            values[key] = {k: v for k, v in values[key].items() if k in ("rope_type", "rope_theta", "type")}
    return values


def tiny_config(model_type: str):
    from transformers import AutoConfig
    default = AutoConfig.for_model(model_type)
    values = shrink(default.to_dict())
    values.pop("model_type", None)
    values.pop("transformers_version", None)
    values.pop("architectures", None)
    return type(default)(**{k: v for k, v in values.items() if not k.startswith("_")})


def build(config, seed: int = 0, sharpen: float = 4.0):
    """A random tiny fp32 model in eval mode; its output layer scaled so greedy choices are clear-cut."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        with torch.no_grad():
            head.weight.mul_(sharpen)
    model.generation_config.pad_token_id = 0
    return model


def noisy_draft(model, seed: int = 1, noise: float = 0.15):
    """A second model of the same architecture: `model`'s weights plus noise of another seed."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1 and p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen) * noise * p.std())
    return draft


def prompts() -> list[list[int]]:
    """A repeated motif with a few changes, longer than WINDOW (prompt lookup finds continuations
    to merge into a tree), and a short one."""
    gen = torch.Generator().manual_seed(3)
    motif = torch.randint(3, VOCAB, (7,), generator=gen).tolist()
    long = (motif * 4)[:26]
    for i in (5, 13, 20):
        long[i] = 3 + (long[i] + 11) % (VOCAB - 3)
    return [long, [5, 17, 33, 9, 41]]


def hf_greedy(model, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, min_new_tokens=0, do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


# ---------------------------------------------------------------------- the check
@dataclass
class Row:
    arch: str
    cells: dict = field(default_factory=dict)    # strategy -> "identical" / "refused" / "FAIL" / "skipped"
    note: str = ""

    @property
    def failed(self) -> bool:
        return any(c.startswith("FAIL") for c in self.cells.values())


def short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def strategy_of(name: str, draft):
    from specdec.strategies.draft_model import DraftModel
    from specdec.strategies.prompt_lookup import PromptLookup
    if name == "prompt_lookup":      # on a target verified on chains (recurrent layers) it drafts one match a step
        return PromptLookup()
    if name == "draft chain":
        return DraftModel(draft, num_tokens=DRAFT_DEPTH)
    return DraftModel(draft, branching=[2, 2, 1, 1])


def run_strategy(name: str, target, draft, references: list[list[int]]) -> tuple[str, str]:
    """(cell, detail) for one strategy on every prompt: identical, refused (a specdec error, at
    Speculator construction or at the first generate), or FAIL (a raw exception or a mismatch)."""
    from specdec import Speculator
    from specdec.errors import SpecDecError
    accepted = 0
    try:
        sd = Speculator(target, None, strategy_of(name, draft))
        for prompt, expected in zip(prompts(), references):
            out = sd.generate(prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            if out.token_ids != expected:
                at = next((i for i, (a, b) in enumerate(zip(out.token_ids, expected)) if a != b),
                          min(len(out.token_ids), len(expected)))
                return "FAIL", f"{name}: differs from HF greedy at new token {at}"
            accepted += sum(out.stats.accepted_lengths)
    except SpecDecError as exc:
        return "refused", f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    except Exception as exc:   # noqa: BLE001 - a raw exception is what the sweep reports
        return "FAIL", f"{name}: {short(exc)}"
    return "identical", f"{name}: {accepted} drafted tokens accepted"


def check(arch: str) -> Row:
    """The sweep's verdict on one architecture."""
    row = Row(arch)
    try:
        config = tiny_config(arch)
    except Exception as exc:  # noqa: BLE001
        return _skip(row, f"no tiny config: {short(exc, 100)}")
    if getattr(config, "is_encoder_decoder", False):
        return _skip(row, "encoder-decoder (its decoder needs encoder outputs)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target = build(config, seed=0)
        draft = noisy_draft(target)
    except Exception as exc:  # noqa: BLE001
        return _skip(row, f"cannot build from a tiny config: {short(exc, 100)}")
    needs = _extra_inputs(target)
    if needs:
        return _skip(row, f"its forward needs {needs} besides input_ids")
    try:
        references = [hf_greedy(target, p) for p in prompts()]
    except Exception as exc:  # noqa: BLE001
        return _skip(row, f"HF generate itself fails: {short(exc, 100)}")
    details = []
    for name in STRATEGIES:
        row.cells[name], detail = run_strategy(name, target, draft, references)
        if row.cells[name] != "identical" or name == "draft tree":
            details.append(detail)
    refusals = {d for n, d in zip(STRATEGIES, details) if row.cells.get(n) == "refused"}
    row.note = "; ".join(sorted(refusals) if refusals and not row.failed else details)
    return row


def _skip(row: Row, reason: str) -> Row:
    row.cells = dict.fromkeys(STRATEGIES, "skipped")
    row.note = reason
    return row


def _extra_inputs(model) -> str | None:
    """Required forward arguments other than the text ones (pixel values, audio, ...)."""
    optional = {"input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "labels",
                "use_cache", "output_attentions", "output_hidden_states", "return_dict", "cache_position",
                "logits_to_keep", "kwargs"}
    params = inspect.signature(model.forward).parameters.values()
    required = [p.name for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in optional]
    return ", ".join(required) or None


def table(rows: list[Row]) -> str:
    lines = ["| architecture | " + " | ".join(STRATEGIES) + " | note |", "|---" * (len(STRATEGIES) + 2) + "|"]
    for row in rows:
        note = row.note.replace("|", "\\|")
        lines.append(f"| {row.arch} | " + " | ".join(row.cells.get(s, "") for s in STRATEGIES) + f" | {note} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse
    import time
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_types", nargs="*", metavar="model_type",
                        help="Hugging Face model types to check (default: every causal-LM architecture)")
    argv = parser.parse_args(argv).model_types
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging
    logging.set_verbosity_error()
    rows = []
    for arch in argv or architectures():
        start = time.perf_counter()
        rows.append(check(arch))
        print(f"{arch}: {', '.join(rows[-1].cells.values())} ({time.perf_counter() - start:.1f} s)",
              file=sys.stderr, flush=True)
    print(table(rows))
    counts = {}
    for row in rows:
        verdict = "FAIL" if row.failed else ("skipped" if "skipped" in row.cells.values() else
                                            "refused" if "refused" in row.cells.values() else "identical")
        counts[verdict] = counts.get(verdict, 0) + 1
    print(f"\n{len(rows)} architectures: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 1 if counts.get("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
