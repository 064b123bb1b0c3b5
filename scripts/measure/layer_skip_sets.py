"""Acceptance of layer_skip on unseen code: for each skip set (a few in the upper-middle layers; with --singles
every single sublayer too) and for SWIFT's on-the-fly choice at a few skip fractions, a greedy chain of
`--tokens` drafts on held-out prompts; prints a markdown table (drafted tokens accepted, tokens per target
forward; for auto the set it ended on per prompt) and writes it as JSON. Acceptance does not depend on the
machine's load; no time is measured here (`specdec bench layer_skip` times it).

    python scripts/measure/layer_skip_sets.py --target DIR --split SPLIT.json --out FOLDER
"""
from __future__ import annotations

import os
import sys

from early_exit_layers import acceptance, held_out_arguments, held_out_code


def main(argv: list[str]) -> int:
    parser = held_out_arguments(__doc__)
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.125, 0.25],
                        help="auto's skip fractions")
    parser.add_argument("--singles", action="store_true", help="also every single sublayer skipped alone")
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.atomic import atomic_write_json
    from specdec.strategies.early_exit import num_layers
    from specdec.strategies.layer_skip import ATTENTION, MLP, LayerSkip, describe
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    count = num_layers(target)
    upper = list(range(count // 2, count - 1))          # the upper-middle layers, the last one kept
    sets = [{kind: [i]} for i in range(count) for kind in (ATTENTION, MLP)] if args.singles else []
    sets += [{ATTENTION: [count - 2]}, {MLP: [count - 2]}, {ATTENTION: upper}, {MLP: upper},
             {ATTENTION: upper, MLP: upper}]
    rows = []
    print("| skipped | drafted tokens accepted | tokens per target forward | auto: set ended on, per prompt |")
    print("|---|---|---|---|")
    for settings in [dict(auto=True, skip_fraction=f) for f in args.fractions] + [dict(s) for s in sets]:
        strategy = LayerSkip(**settings, num_tokens=args.tokens)
        ended: list[str] = []
        sd = Speculator(target, tokenizer, strategy)
        row = acceptance(sd, prompts, args.new, after_each=lambda: ended.append(describe(strategy.skipped)))
        label = f"auto, skip_fraction {settings['skip_fraction']}" if strategy.auto else describe(strategy.start)
        rows.append({"skipped": label, "settings": settings, **row, "ended_on": ended if strategy.auto else None})
        print(f"| {label} | {row['acceptance']:.3f} | {row['tokens_per_forward']:.3f} | "
              f"{'; '.join(ended) if strategy.auto else ''} |", flush=True)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "sets.json"), {"args": vars(args), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
