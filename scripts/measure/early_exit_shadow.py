"""early_exit with its exit layer chosen from shadow tokens (`early_exit.auto`) on held-out code: which exit
layer the choice lands on after each prompt, and the per-layer shadow acceptance it learned (the share of
committed rows where layer E's argmax is the token the target committed next), beside what a chain drafted
at each E would keep if those were independent per token. Acceptance only: no time is measured here.

    python scripts/measure/early_exit_shadow.py --target DIR --split SPLIT.json --out FOLDER [--start E] [--every N]
"""
from __future__ import annotations

import json
import os
import sys

from early_exit_layers import acceptance, held_out_arguments, held_out_code   # this folder's sibling script


def chain_keep(alpha: float, length: int) -> float:
    """Drafted tokens kept per drafted token by a chain of `length` at per-token acceptance `alpha`
    (each kept only if its parent was): (alpha + alpha^2 + ... + alpha^length) / length."""
    return sum(alpha ** i for i in range(1, length + 1)) / length


def main(argv: list[str]) -> int:
    parser = held_out_arguments(__doc__)
    parser.add_argument("--start", type=int, default=4, help="early_exit.exit_layer: where the choice starts")
    parser.add_argument("--every", type=int, default=8, help="early_exit.every")
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.strategies.early_exit import EarlyExit
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    strategy = EarlyExit(args.start, num_tokens=args.tokens, auto=True, every=args.every)
    sd = Speculator(target, tokenizer, strategy)
    chosen = []                                    # the exit layer drafting at the end of each prompt
    result = acceptance(sd, prompts, args.new, after_each=lambda: chosen.append(strategy.exit_layer))
    counts = strategy.counts
    matches = counts.matches.tolist()
    smoothed = counts.acceptance()
    layers = [{"exit_layer": e, "matches": matches[e - 1], "rows": counts.rows, "shadow_acceptance": smoothed[e - 1],
               "chain_keep_if_independent": chain_keep(smoothed[e - 1], args.tokens)} for e in range(1, len(matches) + 1)]
    print(f"exit layer after each prompt: {chosen}; rows counted: {counts.rows:g}; "
          f"tokens per forward {result['tokens_per_forward']:.3f}")
    print("| exit layer E | shadow acceptance | a chain of %d would keep |" % args.tokens)
    for row in layers:
        print(f"| {row['exit_layer']} | {row['shadow_acceptance']:.3f} | {row['chain_keep_if_independent']:.3f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "shadow.json"), "w") as fh:
        json.dump({"args": vars(args), "chosen_after_each_prompt": chosen, "generation": result, "layers": layers},
                  fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
