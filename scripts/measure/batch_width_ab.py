"""auto's batch width (strategies/batch_width.py), A/B in one process: total tokens/s of
generate(list, batch_size=B) over the `batch` preset's prompts for

  * autoregressive,
  * auto          - auto as shipped (every row's tree cut to the one width that pays for the batch),
  * auto-no-fit   - the same auto config with the cut turned off (each row's tree as its planner chose),

in interleaved rounds (each variant its own Speculator, so its batch gate stays warm across rounds as
in `specdec bench`; an 8-token warm-up before each run). Per variant: its median rate over the
rounds and its ratio to autoregressive, and where a call's time went in its last round: the target's
decode forwards (their mean width in tree nodes a row), prefill, and the rows' proposals (drafting).

    python scripts/measure/batch_width_ab.py --eagle /path/to/eagle [--batch 16] [--temperature 0]
        [--rounds 3]
"""
from __future__ import annotations

import collections
import os
import time

import specdec
import specdec.batch as batch_module
from specdec.strategies.auto import Auto

from batch_common import PYCODE, batch_arguments, preset_prompts, print_rates


class StepTimes:
    """Seconds of a call's decode forwards (and their tree width), prefills and proposals."""

    def __init__(self):
        self.seconds, self.counts = collections.defaultdict(float), collections.Counter()
        self.in_prefill = False
        forward, prefill, propose = (batch_module.BatchVerifier.forward, batch_module.BatchVerifier.prefill,
                                     batch_module.propose_rows)
        times = self

        def timed_forward(verifier, pending, trees, *args, **kwargs):
            start = time.perf_counter()
            out = forward(verifier, pending, trees, *args, **kwargs)
            if not times.in_prefill:
                width = max(tree.num_nodes for tree in trees)
                times.seconds["decode forwards"] += time.perf_counter() - start
                times.counts["speculating steps" if width else "plain steps"] += 1
                times.counts["width sum"] += width
            return out

        def timed_prefill(verifier, *args, **kwargs):
            times.in_prefill, start = True, time.perf_counter()
            try:
                return prefill(verifier, *args, **kwargs)
            finally:
                times.in_prefill = False
                times.seconds["prefill"] += time.perf_counter() - start

        def timed_propose(*args, **kwargs):
            start = time.perf_counter()
            trees = propose(*args, **kwargs)
            times.seconds["proposals"] += time.perf_counter() - start
            return trees

        batch_module.BatchVerifier.forward = timed_forward
        batch_module.BatchVerifier.prefill = timed_prefill
        batch_module.propose_rows = timed_propose

    def clear(self) -> None:
        self.seconds.clear()
        self.counts.clear()

    def summary(self) -> str:
        spec = self.counts["speculating steps"]
        width = self.counts["width sum"] / spec if spec else 0.0
        return (f"decode forwards {self.seconds['decode forwards']:.2f} s ({self.counts['plain steps']} plain, {spec} "
                f"speculating, mean width {width:.1f}), prefill {self.seconds['prefill']:.2f} s, "
                f"proposals {self.seconds['proposals']:.2f} s")


def main() -> None:
    parser = batch_arguments(__doc__, temperature=0.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    target = {"target.path": os.path.join(PYCODE, "target")}
    drafters = {"eagle.path": args.eagle} if args.eagle else {}
    speculators = {"autoregressive": specdec.load("autoregressive", **target),
                   "auto": specdec.load("auto", **target, **drafters),
                   "auto-no-fit": specdec.load("auto", **target, **drafters)}
    prompts, new_tokens = preset_prompts(speculators["auto"].tokenizer)
    times, real_fit = StepTimes(), Auto.fit_batch
    sampling = dict(temperature=args.temperature, ignore_eos=True, batch_size=args.batch)
    rates, last = {name: [] for name in speculators}, {}
    for _ in range(args.rounds):
        for name, sd in speculators.items():
            Auto.fit_batch = staticmethod(lambda rows, trees: trees) if name == "auto-no-fit" else real_fit
            try:
                sd.generate(prompts[: args.batch], max_new_tokens=8, seed=list(range(args.batch)), **sampling)
                times.clear()
                start = time.perf_counter()
                out = sd.generate(prompts, max_new_tokens=new_tokens, seed=list(range(len(prompts))),
                                  **sampling)
                rates[name].append(out.stats.new_tokens / (time.perf_counter() - start))
                last[name] = times.summary()
            finally:
                Auto.fit_batch = real_fit
    print_rates(rates, f"batch {args.batch}, T = {args.temperature:g}, {len(prompts)} prompts, "
                       f"drafters {sorted(drafters) or 'none'}", {name: f"last round: {summary}" for name, summary in last.items()})


if __name__ == "__main__":
    main()
