"""One draft model's one-token forward, Hugging Face's own against LeanForward (strategies/lean_forward.py),
timed warm (the same forward again and again) and cold (after streaming `--stream-mb` MiB through the
caches, as the target's forward does between a step's draft calls), on a cache of `--past` prompt tokens.
Means over `--repeats` forwards, in milliseconds.

    python scripts/measure/draft_forward_lean.py --draft MODELS/pycode/draft [--dtype float16]

Why: a draft is called once per drafted token, so its per-call fixed cost and what the target's forward
leaves in the caches decide its drafting time more than its arithmetic (benchmarks/results/lean_draft)."""
from __future__ import annotations

import argparse
import time

import torch

from specdec.cache import new_cache
from specdec.models import cache_kwargs, load_model
from specdec.int8_linear import quantize_linears
from specdec.strategies.lean_forward import LeanForward, why_not_lean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", required=True, help="draft model folder (a Llama, Qwen2 or Mistral)")
    parser.add_argument("--past", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--stream-mb", type=int, default=120)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "int8"),
                        help="the draft's dtype (draft.dtype); int8: int8 weights and bfloat16 activations "
                             "(specdec/int8_linear.py), which only Hugging Face's forward runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    draft = load_model(args.draft, "draft", "cpu", torch.float32)
    if args.dtype == "int8":
        quantize_linears(draft.to(torch.bfloat16))
    else:
        draft.to(getattr(torch, args.dtype))
    lean = LeanForward(draft) if why_not_lean(draft) is None else None
    stream = torch.zeros(args.stream_mb * 2 ** 18)               # float32: MiB * 2^20 / 4
    with torch.inference_mode():
        cache = new_cache(draft)
        draft(input_ids=torch.randint(3, draft.config.vocab_size, (1, args.past)), **cache_kwargs(draft, cache), use_cache=True)
        token = torch.tensor([[5]])

        def own():
            draft(input_ids=token, **cache_kwargs(draft, cache), use_cache=True, logits_to_keep=1)
            cache.crop(-1)

        def plain():
            lean(token, None, None, cache, last_only=True)
            cache.crop(-1)

        for cold in (False, True):
            for name, forward in (("Hugging Face's forward", own), ("LeanForward", plain))[: 2 if lean else 1]:
                for _ in range(20):
                    forward()
                spent = 0.0
                for _ in range(args.repeats):
                    if cold:
                        stream.add_(1.0)
                    started = time.perf_counter()
                    forward()
                    spent += time.perf_counter() - started
                print(f"{'cold' if cold else 'warm'}  {name:24s} {spent / args.repeats * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
