"""Step 4 of the GPU check: greedy identity in bfloat16 for every strategy, with every difference
classified.

For each strategy and each code prompt, specdec's greedy output is compared with Hugging Face's
generate(do_sample=False) on the same bf16 target object. At the first position where they part,
the target is run once more, plainly, over the prompt and the common prefix, and the two tokens'
logits there are compared: both equal to the top logit is a tie (either token is a correct argmax;
which one a kernel returns depends on its summation order); one of them the top and the other
within one unit in the last place of it is a near tie (a cached one-token step, a tree forward and
a plain recompute round differently by that much); anything else is a mismatch, a bug (the rule lives in
specdec.benchmarks.ties, which `specdec bench` uses too). Output: one JSON object per line on stdout,
then a table on stderr; the exit status is 1 when any difference is not excused: a mismatch, or in
float32 any difference at all.

    python scripts/gpu/bf16_identity.py --target DIR [--draft DIR] [--eagle DIR] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import sys

STRATEGIES = {   # row -> (config, overrides, the model it needs)
    "autoregressive": ("autoregressive", {}, None),
    "prompt_lookup": ("prompt_lookup", {}, None),
    "suffix": ("suffix", {}, None),
    "token_recycling": ("token_recycling", {}, None),
    "lookahead": ("lookahead", {}, None),
    "draft_model": ("draft_model", {}, "draft"),
    "draft_model_tree": ("draft_model_tree", {}, "draft"),
    "eagle": ("eagle", {}, "eagle"),
    "auto": ("auto", {}, None),
    # CUDA graphs of the static-shape forward: other kernels, so other roundings (on a CPU inductor's C++
    # build takes a minute a graph, so the dry run leaves these out)
    "autoregressive compiled": ("autoregressive", {"compile": True}, None),
    "eagle compiled": ("eagle", {"compile": True}, "eagle"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft")
    parser.add_argument("--eagle")
    parser.add_argument("--split", help="the family's split.json (held-out files for the prompts)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new", type=int, default=128)
    args = parser.parse_args(argv)

    import torch
    import specdec
    from specdec.benchmarks.config import PromptsConfig
    from specdec.benchmarks.prompts import build_prompt_sets
    from specdec.benchmarks.ties import MISMATCH, NEAR_TIE, TIE, classify

    paths = {"draft": args.draft, "eagle": args.eagle}
    rows, prompts = [], None
    for name, (config, overrides, needs) in STRATEGIES.items():
        if needs and not paths[needs]:
            print(f"{name}: skipped (no --{needs})", file=sys.stderr)
            continue
        if overrides.get("compile") and args.device == "cpu":
            print(f"{name}: skipped (compiled rows run on a GPU)", file=sys.stderr)
            continue
        extra = {"target.path": args.target, "device": args.device, "dtype": args.dtype, **overrides}
        if args.eagle and config in ("eagle", "auto"):
            extra["eagle.path"] = args.eagle
        if args.draft and config in ("draft_model", "draft_model_tree", "auto"):
            extra["draft.path"] = args.draft
        sd = specdec.load(config, **extra)
        if prompts is None:
            split = None if args.split in (None, "", "null") else args.split
            cfg = PromptsConfig(sets=["code"], num=args.prompts, tokens=args.prompt_tokens, split=split)
            prompts = [p.token_ids for p in build_prompt_sets(cfg, sd.tokenizer, 10**9)["code"]]
        row = {"strategy": name, "prompts": len(prompts), "identical": 0, "ties": 0, "near_ties": 0, "mismatches": 0,
               "detail": []}
        for ids in prompts:
            ours = sd.generate(ids, max_new_tokens=args.new, ignore_eos=True).token_ids
            model = sd.target
            x = torch.tensor([ids], device=model.device)
            theirs = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.new, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
            difference = classify(model, ids, ours, theirs)
            if difference is None:
                row["identical"] += 1
                continue
            row[{TIE: "ties", NEAR_TIE: "near_ties", MISMATCH: "mismatches"}[difference["kind"]]] += 1
            row["detail"].append(difference)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sd
    print(f"{'strategy':<18}{'prompts':>8}{'identical':>10}{'ties':>6}{'near ties':>10}{'mismatches':>11}",
          file=sys.stderr)
    for row in rows:
        print(f"{row['strategy']:<18}{row['prompts']:>8}{row['identical']:>10}{row['ties']:>6}{row['near_ties']:>10}"
              f"{row['mismatches']:>11}", file=sys.stderr)
    return 1 if any(not d["excused"] for row in rows for d in row["detail"]) else 0


if __name__ == "__main__":
    sys.exit(main())
