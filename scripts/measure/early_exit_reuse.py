"""What early_exit's KV reuse saves, counted, not timed: the token rows each decoder layer of the target
runs (a forward pre-hook on every layer counts its input's rows; the draft's layers are the target's
own modules, so drafting is counted too) for greedy chains at one exit layer on held-out prompts, with
`early_exit.reuse_kv` off and on, against plain decoding's one row per layer per token. Prints a
markdown table and writes the counts as JSON. The counts do not depend on the machine or its load.

    python scripts/measure/early_exit_reuse.py --target DIR --split SPLIT.json --exit 7 --out FILE.json
"""
from __future__ import annotations

import sys
from collections import Counter

from early_exit_layers import held_out_arguments, held_out_code   # this folder's sibling script


def count_rows(speculator, layers, prompts: list[list[int]], new_tokens: int) -> dict:
    """Generate greedily from every prompt, counting the token rows each layer runs (bind's probes excluded)."""
    rows = Counter()
    handles = [layer.register_forward_pre_hook(lambda module, args, i=i: rows.update({i: args[0].shape[1]}))
               for i, layer in enumerate(layers)]
    outputs, steps, new, accepted, proposed = [], 0, 0, 0, 0
    try:
        for prompt in prompts:
            out = speculator.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True)
            outputs.append(out.token_ids)
            steps, new = steps + out.stats.target_forwards, new + out.stats.new_tokens
            accepted, proposed = accepted + sum(out.stats.accepted_lengths), proposed + out.stats.proposed_nodes
    finally:
        for handle in handles:
            handle.remove()
    return {"layer_rows": [rows[i] for i in range(len(layers))], "steps": steps, "new_tokens": new,
            "accepted": accepted, "proposed": proposed, "outputs": outputs}


def main(argv: list[str]) -> int:
    parser = held_out_arguments(__doc__)         # its --out: the JSON file of the counts
    parser.add_argument("--exit", type=int, required=True, help="exit layer E")
    args = parser.parse_args(argv)
    from specdec import Speculator
    from specdec.atomic import atomic_write_json
    from specdec.strategies.early_exit import EarlyExit, decoder_layers
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    layers = list(target.get_submodule(decoder_layers(target)))
    runs = {}
    for reuse in (False, True):
        strategy = EarlyExit(args.exit, num_tokens=args.tokens, reuse_kv=reuse)
        runs["on" if reuse else "off"] = count_rows(Speculator(target, tokenizer, strategy), layers, prompts, args.new)
        if reuse and strategy.split is None:
            raise SystemExit(f"the KV reuse did not apply: {strategy.reuse_off}")
    if runs["on"]["outputs"] != runs["off"]["outputs"]:
        raise SystemExit("reuse on and off gave different texts: a bug, not a measurement")
    prompt_rows = sum(len(p) - 1 for p in prompts)           # the prefill's rows per layer (all but the pending token)
    print(f"| reuse_kv | steps | new tokens | rows in layers < {args.exit} | rows in layers >= {args.exit} | "
          f"layer-rows | layer-rows per step | layer-rows per new token beyond the target prefill |")
    print("|---|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        lower, upper = sum(run["layer_rows"][: args.exit]), sum(run["layer_rows"][args.exit:])
        after = lower + upper - prompt_rows * len(layers)
        run.update(lower_rows=lower, upper_rows=upper, per_step=(lower + upper) / run["steps"],
                   per_new_token_beyond_target_prefill=after / run["new_tokens"])
        print(f"| {name} | {run['steps']} | {run['new_tokens']} | {lower} | {upper} | {lower + upper} | "
              f"{run['per_step']:.1f} | {run['per_new_token_beyond_target_prefill']:.2f} |")
    print(f"plain decoding: {len(layers)} layer-rows per new token after the prefill ({prompt_rows} prompt rows "
          f"per layer in the prefill)")
    atomic_write_json(args.out, {"args": vars(args), "prompt_rows_per_layer": prompt_rows, "layers": len(layers),
                                 "runs": {name: {k: v for k, v in run.items() if k != "outputs"}
                                          for name, run in runs.items()}}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
