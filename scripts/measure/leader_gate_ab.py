"""auto's leader gate (Auto._leader) on the demo's prompt and default family: the default auto with the gate as
it is, with the gate as it was before its looks forgot the looked-at leader's old steps (fresh_probes off,
4-step looks), and the single-leader rows beside them, one Speculator per row, rows in turn for `--rounds`
calls (the first a warm-up, not counted); per row the median and overall tokens/s of the timed calls and
each call's tokens/s. --trace instead runs one default auto and prints, per call, which leader ran each step
(T: the first leader alone, the table at greedy; e: the others) and the gate's two rates.

    python scripts/measure/leader_gate_ab.py --rounds 16
    python scripts/measure/leader_gate_ab.py --trace --rounds 12 [--old]
"""
from __future__ import annotations

import argparse
import statistics

import torch

import specdec
from specdec.family.demo import DEFAULT_PROMPT, choose_models, load_overrides
from specdec.strategies.auto import LEADER_MEMORY
from specdec.strategies.batch_gate import BatchGate
from specdec.types import Stats

# the gate before fresh looks: a look ran 4 steps and the looked-at leader's rate kept its steps from before
OLD_GATE = dict(margin=0.0, memory=LEADER_MEMORY)
ROWS = {                                   # row -> (overrides beside the demo's, the greedy leader gate or None)
    "default": ({}, None),
    "default(old gate)": ({}, OLD_GATE),
    "auto(tr)": ({"auto.drafter": "token_recycling"}, None),
    "auto(eagle)": ({"auto.more_drafters": []}, None),
}


def load(models, overrides: dict, gate: dict | None):
    speculator = specdec.load("auto", **{**load_overrides("auto", models, "cpu"), **overrides})
    if gate is not None:
        speculator.strategy.leader_gates["greedy"] = BatchGate(**gate)
    return speculator


def trace(models, rounds: int, old: bool) -> None:
    speculator = load(models, {}, OLD_GATE if old else None)
    strategy = speculator.strategy
    original, modes = strategy._leader, []

    def leader(state):
        slot, leads = original(state)
        modes.append("T" if leads else "e")
        return slot, leads

    strategy._leader = leader
    for _ in range(rounds):
        modes.clear()
        out = speculator.generate(DEFAULT_PROMPT, max_new_tokens=128, ignore_eos=True)
        gate = strategy.leader_gates["greedy"]
        print(f"{out.stats.tokens_per_second:6.1f} tok/s  tok/fwd {out.stats.tokens_per_forward:.2f}  gate rates "
              f"T {gate.rate(True) or 0:5.0f} e {gate.rate(False) or 0:5.0f}  {''.join(modes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--old", action="store_true", help="--trace: the old gate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = choose_models(None, None, None, None, None, [], None)
    if args.trace:
        trace(models, args.rounds, args.old)
        return
    speculators = {name: load(models, *row) for name, row in ROWS.items()}
    calls = {name: [] for name in ROWS}
    for _ in range(args.rounds):
        for name, speculator in speculators.items():
            calls[name].append(speculator.generate(DEFAULT_PROMPT, max_new_tokens=128, ignore_eos=True).stats)
    for name, stats in calls.items():
        timed = stats[1:]
        print(f"{name:18s} median {statistics.median(s.tokens_per_second for s in timed):6.1f} tok/s  overall "
              f"{Stats.summed(timed).tokens_per_second:6.1f}  per call {[round(s.tokens_per_second) for s in timed]}")


if __name__ == "__main__":
    main()
