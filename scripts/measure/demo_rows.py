"""`make demo`'s prompt and default family, with rows the demo does not show: family.demo.run_demo runs them
(one Speculator per row, a warm-up call checked against Hugging Face's greedy text, then `--rounds` rounds
over every row in turn, the median kept; what auto learns stays across the calls), and each row prints as
tokens/s, as a multiple of `autoregressive` (when it is among the rows) and with the warm-up call's tokens per
target forward (the demo's own column), and per verify step its drafting and verify milliseconds and its tree
nodes (medians of the timed calls' out.stats).

    python scripts/measure/demo_rows.py --threads 1 --rounds 5 --rows "autoregressive,auto(eagle),auto(eagle+tr)"
"""
from __future__ import annotations

import argparse

import torch

from specdec.family.demo import choose_models, run_demo

# row label -> (strategy, overrides beside the demo's own for it: family.demo.load_overrides)
VARIANTS = {
    "auto(eagle)": ("auto", {"auto.more_drafters": []}),   # the first drafter alone (EAGLE, with the demo's paths)
    "auto(eagle+tr)": ("auto", {}),                   # the demo's auto: EAGLE with the table beside it (the default)
    "auto(tr)": ("auto", {"auto.drafter": "token_recycling"}),
    "auto(none)": ("auto", {"auto.drafter": "none"}),
    "auto(tr+eagle)": ("auto", {"auto.drafter": "token_recycling", "auto.more_drafters": ["eagle"]}),   # the table first
    "auto(tr)-lookup-off": ("auto", {"auto.drafter": "token_recycling", "auto.lookup": False}),
    # EAGLE's own tree, without the table chain (strategies/leaf_chain.py) and 8 levels deep (the default before the
    # chain); auto with the chain under its 8 levels (off there by default: configs/auto.yaml)
    "eagle-nochain": ("eagle", {"eagle.depth": 8, "eagle.table_chain": 0}),
    "auto(eagle)+chain": ("auto", {"auto.more_drafters": [], "eagle.table_chain": 4}),
    "auto(eagle+tr)+chain": ("auto", {"eagle.table_chain": 4}),
    # eagle's greedy trees 8 or 2 levels deep with the chain (eagle's default: 1 level, a chain of 6), and auto with
    # eagle's default (benchmarks/results/eagle_depth)
    "eagle-d8c4": ("eagle", {"eagle.depth": 8, "eagle.table_chain": 4}),
    "eagle-d2c6": ("eagle", {"eagle.depth": 2}),
    "auto(eagle)-d1c6": ("auto", {"auto.more_drafters": [], "eagle.depth": 1, "eagle.table_chain": 6}),
    "auto(eagle+tr)-d1c6": ("auto", {"eagle.depth": 1, "eagle.table_chain": 6}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="autoregressive,auto(eagle),auto(eagle+tr),auto(tr)",
                        help=f"strategies and variants ({', '.join(VARIANTS)}), comma-separated")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run_demo(choose_models(None, None, None, None, None, [], None), max_new_tokens=args.new_tokens,
                      strategies=args.rows.split(","), repeats=args.rounds, variants=VARIANTS)
    if not result.all_identical:
        raise SystemExit(f"not Hugging Face's greedy text: {[row.strategy for row in result.rows if not row.identical]}")
    for row in result.rows:
        print(f"{row.strategy:18s} {row.tokens_per_second:7.1f} tok/s  x autoregressive {row.speedup:5.2f}  "
              f"tok/fwd {row.tokens_per_forward:.2f}  per step: draft {row.draft_ms:.2f} ms, verify "
              f"{row.verify_ms:.2f} ms, {row.nodes:.1f} nodes")
    print(f"{'HF generate()':18s} {len(result.reference_ids) / result.hf_seconds:7.1f} tok/s")
    for name, why in result.skipped.items():
        print(f"skipped {name}: {why}")


if __name__ == "__main__":
    main()
