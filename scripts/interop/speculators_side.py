"""Reference side of the EAGLE-3 conformance check: runs INSIDE the speculators side env.

    python speculators_side.py build --out DIR --verifier VDIR [--seed S] [sizes...]
    python speculators_side.py forward --model DIR --inputs IN.safetensors --out OUT.safetensors --steps K

Imports speculators / transformers / torch / safetensors only (never specdec), so that what it
writes is speculators' own reading of the format. `build` saves a tiny random Llama verifier and an
EAGLE-3 speculator made through speculators' own classes and save_pretrained; `forward` loads it
through speculators' own loaders and runs its own training-time (TTT) forward.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _versions() -> dict:
    return {p: importlib.metadata.version(p) for p in ("speculators", "transformers", "torch")}


def _randomize(model: torch.nn.Module, generator: torch.Generator, skip: tuple[str, ...]) -> None:
    """Every floating weight random (norm weights around 1, the rest N(0, 0.1^2)), so that a
    reader that swaps two weights, or takes one from the verifier instead, cannot agree by luck."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(skip) or not p.dtype.is_floating_point:
                continue
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))


def cmd_build(args: argparse.Namespace) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vconf = LlamaConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        intermediate_size=args.intermediate,
        max_position_embeddings=args.max_positions,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    verifier = LlamaForCausalLM(vconf)
    _randomize(verifier, gen, skip=())
    Path(args.verifier).mkdir(parents=True, exist_ok=True)
    verifier.save_pretrained(args.verifier)

    # The draft's decoder layer config: the verifier's Llama config with the draft's depth.
    tl = LlamaConfig(**{**vconf.to_dict(), "num_hidden_layers": args.draft_layers})
    tl.architectures = None
    tl._attn_implementation = "eager"  # noqa: SLF001 - CPU: no flex attention

    aux = args.aux_layers if args.aux_layers else [1, args.layers // 2, args.layers - 1]
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl,
        draft_vocab_size=args.draft_vocab,
        norm_before_residual=args.norm_before_residual,
        norm_output=args.norm_output,
        eagle_aux_hidden_state_layer_ids=aux,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.speculative_tokens)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(args.verifier)),
        ),
    )
    model = Eagle3DraftModel(config)
    if args.draft_vocab != args.vocab:
        target_ids = torch.randperm(args.vocab, generator=gen)[: args.draft_vocab].sort().values
        d2t = target_ids - torch.arange(args.draft_vocab)  # target id of draft id i = i + d2t[i]
        t2d = torch.zeros(args.vocab, dtype=torch.bool)
        t2d[target_ids] = True
        model.load_vocab_mappings(t2d, d2t)
    # speculators' own flow first (embed_tokens and lm_head[t2d] copied from the verifier), then
    # every saved weight random, embed_tokens and lm_head included: a reader that falls back on
    # the verifier's would disagree.
    model.load_verifier_weights()
    _randomize(model, gen, skip=("verifier_",))
    model.save_pretrained(args.out)
    files = sorted(p.name for p in Path(args.out).iterdir())
    print(json.dumps({"built": str(args.out), "verifier": str(args.verifier), "files": files,
                      "aux_layers": aux, **_versions()}))


def cmd_forward(args: argparse.Namespace) -> None:
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(args.model)
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    model = SpeculatorModel.from_pretrained(args.model, config=config, dtype=torch.float32)
    model.eval()

    inputs = load_file(args.inputs)
    hidden = inputs["hidden_states"].to(torch.float32)
    input_ids = inputs["input_ids"].to(torch.long)
    n = input_ids.shape[1]
    assert hidden.shape[:2] == (1, n), (hidden.shape, input_ids.shape)

    logits, fed_back = [], []
    hooks = [
        model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out.detach())),
        # the last decoder layer's output: what the next step concatenates with its embeddings
        # unless norm_output (then it is the norm's output; logits' input either way)
        model.layers[-1].register_forward_hook(lambda _m, _i, out: fed_back.append(
            (out[0] if isinstance(out, tuple) else out).detach())),
    ]
    with torch.no_grad():
        tokens = model(
            hidden_states=hidden,
            input_ids=input_ids,
            document_ids=torch.zeros(1, n, dtype=torch.long),
            position_ids=torch.arange(n).unsqueeze(0),
            ttt_steps=args.steps,
        )
    for h in hooks:
        h.remove()
    assert len(logits) == len(tokens) == args.steps, (len(logits), len(tokens))
    out = {}
    for k in range(args.steps):
        out[f"logits_{k}"] = logits[k][0].contiguous()
        out[f"tokens_{k}"] = tokens[k][0].contiguous()
        out[f"layer_out_{k}"] = fed_back[k][0].contiguous()
    if model.d2t is not None:
        out["d2t"] = model.d2t.clone()
        out["t2d"] = model.t2d.clone()
    save_file(out, args.out)
    # what from_pretrained kept: the checkpoint's embed_tokens / lm_head, not the verifier's
    saved = load_file(str(Path(args.model) / "model.safetensors"))
    kept = {name: torch.equal(getattr(model, name).weight, saved[f"{name}.weight"])
            for name in ("embed_tokens", "lm_head") if f"{name}.weight" in saved}
    agree = all(bool((out[f"logits_{k}"].argmax(-1) == out[f"tokens_{k}"]).all())
                for k in range(args.steps))
    print(json.dumps({"forward": str(args.model), "n": n, "steps": args.steps,
                      "draft_vocab": int(out["logits_0"].shape[-1]), "argmax_is_tokens": agree,
                      "attn_implementation": model.layers[0].self_attn.config._attn_implementation,  # noqa: SLF001
                      "checkpoint_weights_kept": kept,
                      "out": str(args.out), **_versions()}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="save a tiny verifier and a random EAGLE-3 speculator")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--verifier", required=True, type=Path)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--hidden", type=int, default=64)
    b.add_argument("--layers", type=int, default=4, help="verifier layers")
    b.add_argument("--draft-layers", type=int, default=1)
    b.add_argument("--heads", type=int, default=4)
    b.add_argument("--kv-heads", type=int, default=2)
    b.add_argument("--vocab", type=int, default=256)
    b.add_argument("--draft-vocab", type=int, default=96)
    b.add_argument("--intermediate", type=int, default=128)
    b.add_argument("--max-positions", type=int, default=512)
    b.add_argument("--aux-layers", type=int, nargs="+", default=None,
                   help="eagle_aux_hidden_state_layer_ids (default 1, L//2, L-1)")
    b.add_argument("--speculative-tokens", type=int, default=3)
    b.add_argument("--norm-before-residual", action="store_true")
    b.add_argument("--norm-output", action="store_true")
    f = sub.add_parser("forward", help="speculators' own TTT forward on given inputs")
    f.add_argument("--model", required=True, type=Path)
    f.add_argument("--inputs", required=True, type=Path)
    f.add_argument("--out", required=True, type=Path)
    f.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    {"build": cmd_build, "forward": cmd_forward}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
