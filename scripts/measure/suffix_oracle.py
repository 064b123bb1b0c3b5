"""How much of the `repeat` preset's samples set any drafter that copies earlier text could keep.

The preset (configs/bench/repeat.yaml) asks for 8 samples of each held-out prompt at T = 0.8; from
the second sample on, a suffix drafter may copy from the prompt, the earlier samples' outputs and
the sample's own output so far. This script generates the samples the preset's coupled rows
generate (autoregressive, coupled sampler, seed = sample index: the text every lossless strategy
produces for that seed) and replays them through an *oracle*: at each step it drafts the longest
stretch of the true continuation that occurs anywhere in that history (any tree size, no cost), the
target keeps it, then adds its own token. Tokens per forward of the oracle bound the tokens per
forward of every copying drafter (suffix, prompt lookup) from above, and a speculative step costs at
least a plain one, so they also bound its speed-up over autoregressive decoding.

    python scripts/measure/suffix_oracle.py [--prompts 8] [--samples 8] [--min-context 0 2 4]

--min-context c ...: the copy must follow c tokens that match the c tokens before the position (what
a suffix match of length c needs; 0 = any occurrence, the loosest bound); one bound per value.
"""
from __future__ import annotations

import argparse
import os
import statistics

import specdec
from specdec.benchmarks.config import load_bench_config
from specdec.benchmarks.prompts import build_prompt_sets

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def longest_copy(future: list[int], sources: list[list[int]], context: list[int], min_context: int) -> int:
    """The longest prefix of `future` that occurs in one of `sources` (after `min_context` tokens equal
    to the end of `context`)."""
    best = 0
    need = context[len(context) - min_context:] if min_context else []
    for source in sources:
        for start in range(min_context, len(source)):
            if need and source[start - min_context: start] != need:
                continue
            length = 0
            while (length < len(future) and start + length < len(source)
                   and source[start + length] == future[length]):
                length += 1
            best = max(best, length)
    return best


def oracle_forwards(output: list[int], history: list[list[int]], min_context: int, prompt: list[int]) -> int:
    """Target forwards the oracle needs for `output` given earlier texts `history`."""
    t, forwards = 0, 0
    while t < len(output):
        own = prompt + output[:t]                # the request's own text so far
        kept = longest_copy(output[t:], history + [own], own, min_context)
        t += min(kept, len(output) - t - 1) + 1  # the copy, then the target's own token
        forwards += 1
    return forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--min-context", type=int, nargs="+", default=[0, 2, 4])
    args = parser.parse_args()
    cwd = os.getcwd()
    os.chdir(ROOT)                               # the preset's paths are relative to the repository root
    try:
        cfg = load_bench_config("repeat", {"prompts.num": args.prompts, "prompts.samples": args.samples})
        sd = specdec.load("autoregressive", **{"target.path": cfg.models.target, "generation.sampler": "coupled"})
        prompts = build_prompt_sets(cfg.prompts, sd.tokenizer, 2048 - cfg.max_new_tokens)["samples"]
    finally:
        os.chdir(cwd)
    by_index: dict[tuple[int, int], list[float]] = {}        # (min context, sample index) -> per prompt
    for prompt in prompts:
        outputs = []
        for index in range(args.samples):
            out = sd.generate(prompt.token_ids, max_new_tokens=cfg.max_new_tokens,
                              temperature=cfg.prompts.samples_temperature, seed=index)
            for context in args.min_context:
                forwards = oracle_forwards(out.token_ids, outputs, context, prompt.token_ids)
                by_index.setdefault((context, index), []).append(len(out.token_ids) / forwards)
            outputs.append(out.token_ids)
        print(f"prompt {prompt.index} done", flush=True)
    for context in args.min_context:
        print(f"min context {context}: oracle tokens per forward, mean over {len(prompts)} prompts, by sample: "
              + " ".join(f"{statistics.mean(by_index[context, i]):.2f}" for i in range(args.samples)))
        later = [v for i in range(1, args.samples) for v in by_index[context, i]]
        print(f"  from the 2nd sample on: mean {statistics.mean(later):.2f}, max {max(later):.2f}")


if __name__ == "__main__":
    main()
