"""`specdec bench` with a trace of every call of our rows: how many batch steps speculated, the
seconds of the target's forwards (prefill included) against the call's, and the state of auto's batch
gates after the call (per (batch bucket, temperature kind): the mode kept, its speculating and plain
rates in tokens/s). The bench's own table is unchanged. Arguments are `specdec bench`'s:

    python scripts/measure/bench_trace.py batch models.eagle=/path/to/eagle 'only=[autoregressive,auto]' \\
        'batch_sizes=[32]' 'temperatures=[0.8]' repeats=5 output_dir=TMP/trace progress=false
"""
from __future__ import annotations

import sys
import time

import specdec.batch as batch_module
import specdec.benchmarks.batch as bench_batch
from specdec.cli import main

speculating_steps, forward_s = [0], [0.0]
propose_rows, forward, our_generate = (batch_module.propose_rows, batch_module.BatchVerifier.forward,
                                       bench_batch.our_batch_generate)


def traced_propose_rows(decodings, *args, **kwargs):
    trees = propose_rows(decodings, *args, **kwargs)
    speculating_steps[0] += any(tree.num_nodes for tree in trees)
    return trees


def traced_forward(*args, **kwargs):
    start = time.perf_counter()
    try:
        return forward(*args, **kwargs)
    finally:
        forward_s[0] += time.perf_counter() - start


def traced_generate(row, prompts, *args, **kwargs):
    speculating_steps[0], forward_s[0] = 0, 0.0
    start = time.perf_counter()
    out = our_generate(row, prompts, *args, **kwargs)
    gates = getattr(row.speculator.strategy, "batch_gates", {})
    print(f"   [{row.label}, {len(prompts)} prompts: {time.perf_counter() - start:.2f} s, target forwards "
          f"{forward_s[0]:.2f} s, speculating steps {speculating_steps[0]}; gates "
          f"{ {key: (gate.best, round(gate.rate(True) or 0), round(gate.rate(False) or 0)) for key, gate in gates.items()} }]",
          flush=True)
    return out


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="`specdec bench`'s arguments: a preset or "
                        "YAML, then key=value overrides")
    bench_args = parser.parse_args().bench_args
    batch_module.propose_rows, batch_module.BatchVerifier.forward = traced_propose_rows, traced_forward
    bench_batch.our_batch_generate = traced_generate
    sys.exit(main(["bench"] + bench_args))
