"""`specdec profile <config> key=value ...`: measure (again) the verify cost of n tree nodes on this
machine for the config's target, store it where `auto` reads it, and time the drafter per call."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    from .loading import load
    from .config import parse_overrides
    from .costmodel import measure_and_store, profile_sizes
    parser = argparse.ArgumentParser(prog="specdec profile", description=__doc__)
    parser.add_argument("config", help="a shipped config name (auto, medusa, ...) or a YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. target.path=... draft.path=...")
    parser.add_argument("--prompt", default="def parse(text):\n    ", help="prompt of the drafter timing run")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens of the drafter timing run")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.overrides)
    overrides.setdefault("auto.profile", False)          # measured below, once, fresh
    sd = load(args.config, **overrides)
    auto = sd.config.auto
    # the very profile the strategy plans with (auto); else the one auto would read with this config
    sizes, context = sd.strategy.profile_setup(sd.target) or (profile_sizes(auto.max_nodes), auto.profile_context)
    compiled = sd.verifier.static is not None          # `compile: true`: time the compiled forward
    profile, path, store_error = measure_and_store(sd.target, sizes, context, auto.profile_repeats, compile=compiled)
    print(f"verify cost on {sd.target.device} ({sd.target.dtype}{', compiled' if compiled else ''}), "
          f"context {profile.context_len} tokens, "
          f"profile {profile.key}:")
    print("nodes  seconds    x plain step")
    for n, seconds, relative in zip(profile.sizes, profile.seconds, profile.relative()):
        print(f"{n:5d}  {seconds:.5f}  {relative:6.2f}")
    if store_error is None:
        print(f"profile written to {path}")
    else:
        print(f"specdec profile: could not store the profile in {path} ({store_error.strerror or store_error}): "
              f"`auto` will measure it again at every load; set SPECDEC_HOME to a writable folder and run "
              f"this again", file=sys.stderr)
    sd.strategy.use_costs(profile)
    out = sd.generate(args.prompt, max_new_tokens=args.max_new_tokens)
    stats = out.stats
    per_call = sd.strategy.draft_cost_s
    if per_call is None:
        per_call = stats.draft_time_s / max(stats.target_forwards, 1)
    print(f"drafting ({sd.config.strategy}): {per_call * 1000:.2f} ms per call "
          f"({per_call / profile.seconds[0]:.2f} plain steps); {stats.tokens_per_forward:.2f} tokens per forward, "
          f"{stats.tokens_per_second:.1f} tokens/s over {stats.new_tokens} tokens")
    sizes_chosen = sd.strategy.tree_sizes
    if sizes_chosen is not None:
        print(f"tree sizes chosen per step: {sizes_chosen}")
    return 0 if store_error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
