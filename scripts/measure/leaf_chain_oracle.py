"""What a table chain under a tree's deepest leaf could add, before building one: runs a strategy on held-out
files (auto_variants.py's prompts, greedy, 128 new tokens) and, at every step whose accepted path ended at a
leaf of the verified tree, counts how many of the target's next tokens a top-1 chain would have matched, with
the table approximated by the committed text (each token's row = the token after its last occurrence). Prints
the share of steps that end at a leaf (any, and the deepest), and the mean extra tokens per step for chains of
1, 2 and 4 under the deepest leaf only (what strategies/leaf_chain.py hangs) and under whichever leaf was kept.

    python scripts/measure/leaf_chain_oracle.py --target T --eagle E --split S/split.json --strategy eagle \\
        --overrides '{"eagle.table_chain": 0}'
"""
from __future__ import annotations

import argparse
import collections
import json

import torch

import specdec
from auto_variants import prompts_from


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--strategy", default="eagle")
    parser.add_argument("--overrides", default="{}", help="config overrides, JSON")
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    sd = specdec.load(args.strategy, **{"target.path": args.target, "eagle.path": args.eagle},
                      **json.loads(args.overrides))
    steps, prompt_ids = [], []
    observe = sd.strategy.observe

    def recorded(state, result):
        parents, last = result.tree.parents, (result.accepted[-1] if result.accepted else -1)
        if parents:
            depths = result.tree.depths()
            deepest = depths.index(max(depths))
            steps.append((result.committed_before, result.num_accepted, last not in parents, last == deepest))
        else:
            steps.append((result.committed_before, result.num_accepted, False, False))
        prompt_ids[:] = state.token_ids[: state.prompt_len]
        observe(state, result)
    sd.strategy.observe = recorded
    gains = {"any leaf": collections.Counter(), "deepest leaf": collections.Counter()}
    total = 0
    for prompt in prompts_from(args.split, sd.tokenizer, args.prompts):
        steps.clear()
        out = sd.generate(prompt, max_new_tokens=128, temperature=0, ignore_eos=True)
        ids = list(prompt_ids) + list(out.token_ids)
        total += len(steps)
        for before, accepted, at_leaf, at_deepest in steps:
            if not at_leaf:
                continue
            context, after = ids[: before + accepted], ids[before + accepted:]    # through the leaf; the target's next
            table = dict(zip(context, context[1:]))
            matched, token = 0, context[-1]
            for wanted in after[:8]:
                if table.get(token) != wanted:
                    break
                matched, token = matched + 1, wanted
            gains["any leaf"][matched] += 1
            if at_deepest:
                gains["deepest leaf"][matched] += 1
    print(f"{args.strategy} {args.overrides}: {total} steps")
    for where, counts in gains.items():
        ended = sum(counts.values())
        extra = [sum(min(m, length) * c for m, c in counts.items()) / total for length in (1, 2, 4)]
        print(f"  ended at {where}: {ended} ({ended / total:.0%}); extra tokens per step, chain of 1 / 2 / 4: "
              + " / ".join(f"{x:.2f}" for x in extra))


if __name__ == "__main__":
    main()
