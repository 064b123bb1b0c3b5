"""What auto's batch gate sees, against the steps' wall time: three calls in a row on one auto
Speculator (its gate warm from the call before, as in `specdec bench`) over the `batch` preset's
prompts. Per call and mode (speculating / plain), over the steps with a full batch: how many, the
median and mean step time between two proposals (the mean includes steps that started new prompts
and caught drafters up on them), and the samples the gate closed for that mode (their batch tokens/s,
median seconds and mean tokens a step); then the gate's own rates and its choice.

    python scripts/measure/batch_gate_steps.py --eagle /path/to/eagle [--batch 16] [--temperature 0.8]
"""
from __future__ import annotations

import os
import statistics
import time

import specdec
import specdec.batch as batch_module
from specdec.strategies.batch_gate import BatchGate

from batch_common import PYCODE, batch_arguments, preset_prompts


def main() -> None:
    parser = batch_arguments(__doc__, temperature=0.8)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    drafters = {"eagle.path": args.eagle} if args.eagle else {}
    auto = specdec.load("auto", **{"target.path": os.path.join(PYCODE, "target")}, **drafters)
    prompts, new_tokens = preset_prompts(auto.tokenizer)
    closed, steps = [], []            # the gate's closed samples (mode, tokens, seconds); (time, speculated, rows)
    end_step, propose_rows = BatchGate.end_step, batch_module.propose_rows

    def logged_end_step(gate):
        for mode in (True, False):
            if gate.step_rows[mode]:
                closed.append((mode, gate.step_tokens_sum[mode] / gate.step_rows[mode],
                               gate.step_seconds_sum[mode] / gate.step_rows[mode]))
        return end_step(gate)

    def logged_propose_rows(decodings, *rest, **kwargs):
        trees = propose_rows(decodings, *rest, **kwargs)
        steps.append((time.perf_counter(), any(tree.num_nodes for tree in trees), len(decodings)))
        return trees

    BatchGate.end_step, batch_module.propose_rows = logged_end_step, logged_propose_rows
    sampling = dict(temperature=args.temperature, ignore_eos=True, batch_size=args.batch)
    for call in range(args.calls):
        auto.generate(prompts[: args.batch], max_new_tokens=8, seed=list(range(args.batch)), **sampling)
        closed.clear()
        steps.clear()
        auto.generate(prompts, max_new_tokens=new_tokens, seed=list(range(len(prompts))), **sampling)
        wall = {True: [], False: []}
        for (start, mode, rows), (end, _, _) in zip(steps, steps[1:]):
            if rows == args.batch:
                wall[mode].append(end - start)
        for mode in (True, False):
            samples = [(tokens, seconds) for m, tokens, seconds in closed if m == mode]
            line = f"call {call} {'speculating' if mode else 'plain':11s} steps {len(wall[mode]):3d}"
            if wall[mode]:
                line += (f", step median {1e3 * statistics.median(wall[mode]):5.1f} ms, "
                         f"mean {1e3 * statistics.mean(wall[mode]):5.1f} ms")
            if samples:
                tokens, seconds = sum(t for t, _ in samples), sum(s for _, s in samples)
                line += (f" | gate samples {len(samples)}: {tokens / seconds:.0f} tok/s, median "
                         f"{1e3 * statistics.median(s for _, s in samples):.1f} ms, {tokens / len(samples):.1f} tokens a step")
            print(line)
        for key, gate in auto.strategy.batch_gates.items():
            if key[0] >= args.batch:
                print(f"  gate {key}: keeps {'speculation' if gate.best else 'plain decoding'}; rates "
                      f"speculating {gate.rate(True) or 0:.0f}, plain {gate.rate(False) or 0:.0f} tok/s")


if __name__ == "__main__":
    main()
