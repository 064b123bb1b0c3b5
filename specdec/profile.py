"""`specdec profile <config> key=value ...`: measure (again) the verify cost of n tree nodes on this
machine for the config's target, store it where `auto` reads it, and time the drafter per call."""
from __future__ import annotations

import argparse
import statistics
import sys

import torch


def verify_against_plain(target, sizes, context_len: int, repeats: int,
                         row_linear: int = 0) -> list[tuple[int, float, float]]:
    """[(n, verify s, plain s)]: our verify forward of an n-node tree against a plain Hugging Face
    forward of n + 1 tokens (a chain, its own causal mask, a DynamicCache) on caches of context_len
    tokens, timed in the same rounds (medians), so what the tree machinery adds shows apart from the
    target's own work on n + 1 tokens."""
    from transformers import DynamicCache
    from .costmodel import _now, _single_forward, random_prompt_and_trees
    from .models import cache_kwargs
    from .tree import host_to_device
    prompt, trees = random_prompt_and_trees(target, sizes, context_len)
    verify, rollback = _single_forward(target, prompt, trees, row_linear=row_linear)
    device = target.device
    cache = DynamicCache()
    with torch.inference_mode():
        target(host_to_device([prompt[:-1]], device), **cache_kwargs(target, cache), use_cache=True)
    chains = {n: host_to_device([[prompt[-1]] + trees[n].tokens.tolist()], device) for n in sizes}

    def plain(n: int) -> None:
        with torch.inference_mode():
            target(chains[n], **cache_kwargs(target, cache), use_cache=True)
        cache.crop(context_len - 1 - cache.get_seq_length())     # negative: the tokens to drop

    def timed(fn, n: int) -> float:
        start = _now(device)
        fn(n)
        return _now(device) - start

    for n in sizes:                                           # warm-up
        verify(n), rollback(), plain(n)
    verify_s: dict[int, list[float]] = {n: [] for n in sizes}
    plain_s: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            verify_s[n].append(timed(verify, n))
            rollback()
            plain_s[n].append(timed(plain, n))
    return [(n, statistics.median(verify_s[n]), statistics.median(plain_s[n])) for n in sizes]


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
    row_linear = sd.verifier.row_linear                # the setting in effect (0: no RowLinear twin)
    profile, path, not_stored = measure_and_store(sd.target, sizes, context, auto.profile_repeats, compile=compiled,
                                                  row_linear=row_linear)
    print(f"verify cost on {sd.target.device} ({sd.target.dtype}{', compiled' if compiled else ''}), "
          f"context {profile.context_len} tokens, "
          f"profile {profile.key}:")
    print("nodes  seconds    x plain step")
    for n, seconds, relative in zip(profile.sizes, profile.seconds, profile.relative()):
        print(f"{n:5d}  {seconds:.5f}  {relative:6.2f}")
    if profile.cpu_wait is not None:
        print(f"waited for a core {profile.cpu_wait:.0%} of the measurement (other work on the CPU)")
    if not_stored is None:
        print(f"profile written to {path}")
    else:
        print(f"specdec profile: could not store the profile in {path}: {not_stored}. `auto` will measure it "
              f"again at its next load", file=sys.stderr)
    if not compiled:
        print("verify against a plain Hugging Face forward of n + 1 tokens (same context, same rounds):")
        print("nodes  verify ms  plain ms  verify / plain")
        for n, verify_s, plain_s in verify_against_plain(sd.target, profile.sizes, profile.context_len,
                                                         auto.profile_repeats, row_linear):
            print(f"{n:5d}  {verify_s * 1000:9.2f}  {plain_s * 1000:8.2f}  {verify_s / plain_s:14.2f}")
    sd.strategy.use_costs(profile)
    out = sd.generate(args.prompt, max_new_tokens=args.max_new_tokens)
    stats = out.stats
    split = stats.step_split()
    print(f"per verify step ({stats.target_forwards} steps, {split.nodes:.1f} nodes each): "
          f"draft {split.draft_ms:.2f} ms, verify {split.verify_ms:.2f} ms, "
          f"other {split.other_ms:.2f} ms (a plain one-token verify: "
          f"{profile.seconds[0] * 1000:.2f} ms)")
    per_call = sd.strategy.draft_cost_s
    if per_call is None:
        per_call = split.draft_ms / 1000
    print(f"drafting ({sd.config.strategy}): {per_call * 1000:.2f} ms per call "
          f"({per_call / profile.seconds[0]:.2f} plain steps); {stats.tokens_per_forward:.2f} tokens per forward, "
          f"{stats.tokens_per_second:.1f} tokens/s over {stats.new_tokens} tokens")
    sizes_chosen = sd.strategy.tree_sizes
    if sizes_chosen is not None:
        print(f"tree sizes chosen per step: {sizes_chosen}")
    return 0 if not_stored is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
