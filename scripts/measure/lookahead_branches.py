"""Where lookahead's accepted tokens come from, on unseen code: for each setting (W, N, G, context pool),
greedy generation on held-out prompts, and per verify step the nodes of the lookahead branch (the
window's cells) and of the verification branch (the pool's n-grams after the pending token; a node on
both counts as verification), and the accepted nodes of each. Prints a markdown table. Acceptance does
not depend on the machine's load; no time is measured here (`specdec bench lookahead` times the same
rows). With --auto, also auto with lookahead as its drafter (auto.drafter=lookahead, its verify costs
measured at load, cached under SPECDEC_HOME): the share of steps where it called lookahead.

    python scripts/measure/lookahead_branches.py --target DIR --split SPLIT.json [--auto]
"""
from __future__ import annotations

import argparse
import sys

from early_exit_layers import held_out_code   # this folder's sibling script: target, tokenizer, held-out prompts

SETTINGS = ((5, 4, 5, False), (3, 3, 3, False), (7, 5, 7, False), (5, 4, 5, True))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--split", help="JSON with a 'heldout' list of files (the family's split)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--auto", action="store_true", help="also auto.drafter=lookahead: how often auto calls it")
    parser.add_argument("--skip-settings", action="store_true", help="only the --auto row")
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.strategies.lookahead import Lookahead

    class Recorded(Lookahead):
        """Lookahead that sorts each step's nodes, and its accepted ones, by branch."""

        def reset(self, state):
            super().reset(state)
            self.counts = dict(steps=0, window=0, verification=0, kept_window=0, kept_verification=0)

        def observe(self, state, result):
            on_guess = self.drafted.guess_nodes
            if result.tree is self.drafted.tree:
                c = self.counts
                c["steps"] += 1
                c["verification"] += len(on_guess)
                c["window"] += result.tree.num_nodes - len(on_guess)
                c["kept_verification"] += sum(1 for node in result.accepted if node in on_guess)
                c["kept_window"] += sum(1 for node in result.accepted if node not in on_guess)
            super().observe(state, result)

    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    print("| W, N, G | context pool | tok/fwd | nodes per step: window / verification | accepted per step: "
          "window / verification |")
    print("|---|---|---|---|---|")
    for window, ngram, guesses, pool in () if args.skip_settings else SETTINGS:
        totals = dict(steps=0, window=0, verification=0, kept_window=0, kept_verification=0, new=0, forwards=0)
        for prompt in prompts:
            strategy = Recorded(window, ngram, guesses, pool_from_context=pool)
            out = Speculator(target, tokenizer, strategy).generate(prompt, max_new_tokens=args.new, ignore_eos=True)
            for key, value in strategy.counts.items():
                totals[key] += value
            totals["new"] += len(out.token_ids)
            totals["forwards"] += out.stats.target_forwards
        steps = totals["steps"]
        print(f"| {window}, {ngram}, {guesses} | {'yes' if pool else 'no'} | "
              f"{totals['new'] / totals['forwards']:.2f} | "
              f"{totals['window'] / steps:.1f} / {totals['verification'] / steps:.1f} | "
              f"{totals['kept_window'] / steps:.2f} / {totals['kept_verification'] / steps:.2f} |", flush=True)
    if args.auto:        # auto_calls.py, this folder's sibling script, counts auto's calls of lookahead
        from auto_calls import main as count_auto_calls
        count_auto_calls(["--target", args.target, "--drafters", "lookahead", "--prompts", str(args.prompts),
                          "--prompt-tokens", str(args.prompt_tokens), "--new", str(args.new)]
                         + (["--split", args.split] if args.split else []))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
