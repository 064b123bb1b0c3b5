"""Acceptance of a trained MTP module (`specdec train mtp`) against an EAGLE-1 drafter on unseen code: greedy
generations from held-out prompts with each drafting the same shapes (a chain of `--tokens`, and a tree of
`--tree-nodes` nodes, top-k `--tree-top-k`), both in float32 beside the float32 target and both ranking their
trees by their own probabilities (no early stop); prints a markdown table (drafted tokens accepted, tokens per
target forward) and writes it as JSON. Acceptance does not depend on the machine's load; no time is measured
here (`specdec bench` times them).

    python scripts/measure/mtp_against_eagle.py --target DIR --split SPLIT.json --mtp MTP_DIR --eagle EAGLE_DIR --out FOLDER
"""
from __future__ import annotations

import json
import os
import sys

from early_exit_layers import acceptance, held_out_arguments, held_out_code


def main(argv: list[str]) -> int:
    parser = held_out_arguments(__doc__)
    parser.add_argument("--mtp", required=True, help="output folder of `specdec train mtp` (mtp.json)")
    parser.add_argument("--eagle", required=True, help="output folder of `specdec train eagle` (eagle.json)")
    parser.add_argument("--tree-nodes", type=int, default=11)
    parser.add_argument("--tree-top-k", type=int, default=4)
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.heads.eagle_io import load_eagle
    from specdec.strategies.eagle import Eagle
    from specdec.strategies.mtp import Mtp
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    shapes = {"chain": dict(depth=args.tokens, top_k=1, max_nodes=args.tokens),
              "tree": dict(depth=8, top_k=args.tree_top_k, max_nodes=args.tree_nodes)}
    drafters = {"mtp": lambda shape: Mtp.for_target(target, modules=args.mtp, **shape),
                "eagle": lambda shape: Eagle(load_eagle(args.eagle, target), stop_below=0.0, score_temperature=1.0,
                                             dtype=None, **shape)}
    rows = []
    print("| drafter | shape | drafted tokens accepted | tokens per target forward |")
    print("|---|---|---|---|")
    for shape_name, shape in shapes.items():
        for name, build in drafters.items():
            sd = Speculator(target, tokenizer, build(shape))
            rows.append({"drafter": name, "shape": shape_name, **shape, **acceptance(sd, prompts, args.new)})
            print(f"| {name} | {shape_name} {shape} | {rows[-1]['acceptance']:.3f} | "
                  f"{rows[-1]['tokens_per_forward']:.3f} |", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "acceptance.json"), "w") as fh:
        json.dump({"args": vars(args), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
