"""How often `auto` calls its drafter, on unseen code: for each drafter named, greedy generations on
held-out prompts with auto (prompt lookup plus that drafter), and the share of verify steps on which auto
called the drafter, split by why (a look: a context's first call, a look's steady second call, a look
after its gap; or because its priced rate beat lookup alone's), with tokens per forward. A count, not a
timing: the decisions themselves read the step times auto measures as it runs, so the load of the
machine can move them a little; no time is printed.

    python scripts/measure/auto_calls.py --target DIR --split SPLIT.json --drafters lookahead,early_exit \
        [--set early_exit.exit_layer=7 ...]

--set: dotted config overrides given to every auto (e.g. eagle.path=DIR for --drafters eagle).
--profile-threads N: plan with the verify-cost profile stored for N torch threads (under SPECDEC_HOME),
read while auto binds, then generate with one thread. On a loaded machine a profile measured in the run
is noise that moves every decision (and is not stored): two checkouts compared should plan with one
profile measured on a quiet machine. auto still scales it by the step times it observes.

After the table, for a drafter that counts shadow tokens (early_exit inside auto), the rows counted and
each exit layer's shadow acceptance at the end: what priced its calls.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from early_exit_layers import held_out_code   # this folder's sibling script: target, tokenizer, held-out prompts


def traced_reasons(auto_class) -> Counter:
    """Wrap auto_class._call_drafter to count why each call was made (a look or a paying rate)."""
    reasons: Counter = Counter()
    decide = auto_class._call_drafter

    def traced(self, state, context):
        look = (self.steps_since_call == 1 and not self.steady_call) or context not in self.plan_with
        if hasattr(self, "measured_loss"):       # judged by its plans and by what its calls did
            pays = self.planned_loss(context) is None and self.measured_loss(context) is None
        else:                                     # a checkout before that: by its plans alone
            rate_with, rate_without = self.planned_rates(context)
            pays = rate_with is not None and rate_with >= rate_without
        called = decide(self, state, context)
        if called:
            reasons["pays" if pays and not look else "look"] += 1
        return called
    auto_class._call_drafter = traced
    return reasons


def count_calls(sd, prompts: list[list[int]], new: int) -> tuple[int, int, int]:
    """(drafter calls, verify steps, new tokens) of greedy generations of `new` tokens from each prompt by
    sd, a Speculator running auto."""
    calls = forwards = made = 0
    for prompt in prompts:
        before = sd.strategy.neural_calls
        out = sd.generate(prompt, max_new_tokens=new, ignore_eos=True)
        calls += sd.strategy.neural_calls - before
        forwards += out.stats.target_forwards
        made += len(out.token_ids)
    return calls, forwards, made


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--split", help="JSON with a 'heldout' list of files (the family's split)")
    parser.add_argument("--drafters", required=True, help="comma-separated auto.drafter values")
    parser.add_argument("--set", action="append", default=[], help="a dotted override, key=value (repeatable)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--profile-threads", type=int, help="plan with the stored profile of this many threads")
    args = parser.parse_args(argv)
    import torch
    from specdec import Speculator
    from specdec.config import load_spec_config
    from specdec.strategies.auto import Auto, from_config
    target, tokenizer, prompts = held_out_code(args.target, args.split, args.prompts, args.prompt_tokens)
    reasons = traced_reasons(Auto)
    shadows = []                      # (auto.drafter, the drafter) of drafters that count shadow tokens
    print("| auto.drafter | steps | drafter called | share | looks | priced as paying | tok/fwd | profile's wait |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.drafters.split(","):
        reasons.clear()
        cfg = load_spec_config("auto", [f"auto.drafter={name}", f"target.path={args.target}", *args.set])
        strategy = from_config(cfg, target, tokenizer, target.device, target.dtype)
        threads = torch.get_num_threads()
        torch.set_num_threads(args.profile_threads or threads)      # the profile's key names its thread count
        sd = Speculator(target, tokenizer, strategy, config=cfg)      # engine settings too (e.g. row_linear)
        torch.set_num_threads(threads)
        calls, forwards, new = count_calls(sd, prompts, args.new)
        print(f"| {name} | {forwards} | {calls} | {calls / forwards:.1%} | {reasons['look']} | {reasons['pays']} | "
              f"{new / forwards:.2f} | {strategy.costs.cpu_wait} |", flush=True)
        if getattr(strategy.drafter, "counts", None) is not None:
            shadows.append((name, strategy.drafter))
    for name, drafter in shadows:
        counts = drafter.counts
        acceptance = ", ".join(f"E={layer} {value:.3f}" for layer, value in zip(drafter.counted_layers, counts.acceptance()))
        print(f"\n{name} (exit layer at the end: {drafter.exit_layer}): shadow acceptance over {counts.rows:g} "
              f"committed rows: {acceptance}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
