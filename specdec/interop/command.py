"""`specdec export KIND SOURCE --format F --out DIR`: a trained drafter in a layout another tool
reads (specdec.heads.medusa_formats, specdec.heads.eagle_formats). Kinds: medusa (--format vllm | medusa), eagle (--format speculators |
sglang | eagle)."""
from __future__ import annotations

import argparse
import sys

from specdec.errors import ConfigError


def _load_target(path: str | None):
    if path is None:
        return None
    import torch

    from specdec.models import load_model
    return load_model(path, "target", torch.device("cpu"), torch.float32, key="--target")


def export_medusa(args) -> str:
    from specdec.heads.io import load_heads
    from specdec.heads.medusa_formats import export_heads
    target = _load_target(args.target)
    heads = load_heads(args.source, target)       # with a target: checked against it (fingerprint)
    return export_heads(heads, args.out, args.format, target=target, base_model=args.base_model or args.target)


def export_eagle(args) -> str:
    from specdec.heads.eagle_io import load_eagle
    from specdec.heads.eagle_formats import export_eagle3
    target = _load_target(args.target)
    drafter = load_eagle(args.source, target)     # with a target: checked against it (fingerprint)
    return export_eagle3(drafter, args.out, args.format, target=target,
                         verifier=args.verifier or args.base_model or args.target,
                         speculative_tokens=args.speculative_tokens)


KINDS = {"medusa": (export_medusa, ("vllm", "medusa")), "eagle": (export_eagle, ("speculators", "sglang", "eagle"))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specdec export", description=__doc__)
    parser.add_argument("kind", choices=sorted(KINDS), help="what to export")
    parser.add_argument("source", help="the folder specdec wrote (`specdec train-heads ... output_dir=`)")
    parser.add_argument("--format", required=True, help="medusa: vllm (vLLM's Medusa model) or medusa "
                        "(FasterDecoding's medusa_lm_head layout); eagle: speculators (what vLLM serves), sglang "
                        "(SGLang's LlamaForCausalLMEagle3) or eagle (the EAGLE repository's)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--target", help="the target's folder: needed when the heads use its lm_head (the "
                        "default), which is written out beside them; also checks they were trained for it")
    parser.add_argument("--base-model", help="the target's name to record in the export (default: --target)")
    parser.add_argument("--verifier", help="eagle, speculators: the target's Hugging Face name or folder that vLLM "
                        "loads beside the drafter (default: --base-model, then --target)")
    parser.add_argument("--speculative-tokens", type=int, default=3, help="eagle, speculators: the draft length "
                        "vLLM uses by default (speculators_config.proposal_methods[0].speculative_tokens)")
    args = parser.parse_args(argv)
    run, formats = KINDS[args.kind]
    if args.format not in formats:
        raise ConfigError(f"`specdec export {args.kind}` writes --format {' or '.join(formats)}, not {args.format!r}")
    out = run(args)
    print(f"wrote {args.kind} ({args.format}) to {out}", file=sys.stderr)
    return 0
