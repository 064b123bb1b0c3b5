"""Where a speculative step goes, per strategy: milliseconds per verify step of draft / verify / other
(the loop's own split, out.stats) and torch ops dispatched per step in each part (counted, so it does
not depend on the machine's load). Run it with two checkouts' interpreters, interleaved, for an A/B.

    python scripts/measure/step_split.py --strategies autoregressive,eagle,auto [--rounds 5] [key=value ...]

With no target.path it runs on the embedded default family. Every generation gets a prompt of its own (the
demo's, then slices of standard-library modules), so tree shapes are as new as they are in use: the same
prompt again would find every shape's tables already built."""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sysconfig

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec
from specdec.config import parse_overrides
from specdec.family.demo import DEFAULT_PROMPT


STDLIB_MODULES = ("textwrap.py", "json/decoder.py", "csv.py", "shlex.py", "fractions.py", "heapq.py",
                  "bisect.py", "string.py", "glob.py", "fnmatch.py")


def prompts(count: int, chars: int = 1200) -> list[str]:
    """The demo's prompt, then `chars`-character slices of standard-library modules (the same on every run)."""
    out = [DEFAULT_PROMPT]
    root = sysconfig.get_paths()["stdlib"]
    for name in STDLIB_MODULES:
        if len(out) >= count:
            break
        with open(os.path.join(root, name)) as f:
            text = f.read()
        start = len(text) // 3
        out.append(text[start: start + chars])
    return out[:count]


class OpCounter(TorchDispatchMode):
    """Counts the torch ops dispatched while `part` names where the loop is."""

    def __init__(self):
        super().__init__()
        self.part = "other"
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.part] += 1
        return func(*args, **(kwargs or {}))


def _in_part(counter: OpCounter, fn, part: str):
    def wrapped(*args, **kwargs):
        before, counter.part = counter.part, part
        try:
            return fn(*args, **kwargs)
        finally:
            counter.part = before
    return wrapped


def ops_per_step(sd, prompt: str, max_new_tokens: int) -> dict:
    counter = OpCounter()
    strategy, verifier = sd.strategy, sd.verifier
    prefill = "prefill_outputs" if hasattr(verifier, "prefill_outputs") else "prefill"   # what the loop calls
    saved = {(obj, name): getattr(obj, name) for obj, name in
             ((strategy, "propose"), (strategy, "observe"), (verifier, "forward"), (verifier, prefill))}
    for (obj, name), fn in saved.items():
        setattr(obj, name, _in_part(counter, fn, {"propose": "draft", "observe": "draft", "forward": "verify",
                                                  prefill: "prefill"}[name]))
    try:
        with counter:
            out = sd.generate(prompt, max_new_tokens=max_new_tokens)
    finally:
        for (obj, name) in saved:
            delattr(obj, name)                      # back to the class's method
    steps = max(out.stats.target_forwards, 1)
    return {part: counter.counts[part] / steps for part in ("draft", "verify", "other")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="autoregressive,eagle,prompt_lookup,auto")
    parser.add_argument("--rounds", type=int, default=5, help="timed generations per strategy (medians kept)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("overrides", nargs="*", help="key=value for specdec.load, e.g. target.path=...")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = parse_overrides(args.overrides)
    rows = []
    texts = prompts(args.rounds + 2)
    for name in args.strategies.split(","):
        sd = specdec.load(name, **overrides)
        sd.generate(texts[-1], max_new_tokens=32)                          # warm-up
        runs = [sd.generate(text, max_new_tokens=args.max_new_tokens).stats for text in texts[:args.rounds]]

        def median(per_step):
            return statistics.median(per_step(s) for s in runs)
        row = {"strategy": name, "tokens_per_s": median(lambda s: s.tokens_per_second),
               "tau": median(lambda s: s.tokens_per_forward),
               **{f"{part}_ms": median(lambda s, p=part: getattr(s.step_split(), f"{p}_ms"))
                  for part in ("draft", "verify", "other")},
               **{f"{part}_ops": n for part, n in ops_per_step(sd, texts[args.rounds], args.max_new_tokens).items()}}
        rows.append(row)
        print(f"{name:16s} {row['tokens_per_s']:7.1f} tok/s  tau {row['tau']:.2f}  ms/step draft {row['draft_ms']:.2f} "
              f"verify {row['verify_ms']:.2f} other {row['other_ms']:.2f}  ops/step draft {row['draft_ops']:.0f} "
              f"verify {row['verify_ops']:.0f} other {row['other_ops']:.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
