"""auto's batch gate, A/B in one process: total tokens/s of generate(list, batch_size=B) for

  * auto          - auto as shipped (its batch gate measures speculation against plain decoding);
  * auto-one-gate - auto with its speculation gate alone: no drafter gate, so every speculating step
                    calls the drafter where auto's drafter policy says so (auto before the drafter gate);
  * auto-plain    - the same auto with its gate forced to plain decoding (what the gate can reach
                    where speculation loses: auto's own per-step overhead included);
  * auto-no-gate  - auto.batch_gate off (every row speculates whenever its planner says so);
  * autoregressive,

in interleaved rounds (each variant once per round, gates reset before each run, an untimed 8-token
warm-up first), each variant's median over the rounds and its ratio to autoregressive.

    python scripts/measure/batch_gate_ab.py --eagle /path/to/eagle [--batch 16] [--temperature 0.8]
        [--prompts 32] [--rounds 3] [--draft ../shared/models/pycode/draft] [--prompt-set preset]

Prompts: 256-token windows of the pycode split's held-out standard-library files (several per file
where there are too few files), 128 new tokens each, seeds 0.. per prompt; or the `batch` bench
preset's prompts and new tokens (--prompt-set preset).
"""
from __future__ import annotations

import json
import os
import random
import sysconfig
import time

import specdec
from batch_common import PYCODE, batch_arguments, preset_prompts, print_rates
from specdec.strategies.auto import Auto
from specdec.strategies.batch_gate import BatchGate


def held_out_prompts(tokenizer, count: int, length: int = 256) -> list[list[int]]:
    files = json.load(open(os.path.join(PYCODE, "split.json")))["heldout"]
    stdlib, rng, prompts = sysconfig.get_paths()["stdlib"], random.Random(0), []
    while len(prompts) < count:
        for name in sorted(files):
            path = os.path.join(stdlib, name)
            if not os.path.exists(path):
                continue
            ids = tokenizer(open(path, errors="ignore").read())["input_ids"]
            if len(ids) > 2 * length + 100:
                start = rng.randrange(0, len(ids) - length - 50)
                prompts.append(ids[start: start + length])
            if len(prompts) >= count:
                break
    return prompts


def main() -> None:
    parser = batch_arguments(__doc__, temperature=0.8)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-set", choices=("held-out", "preset"), default="held-out",
                        help="held-out: --prompts windows of held-out files, 128 new tokens each; preset: the "
                             "`batch` bench preset's prompts and new tokens")
    args = parser.parse_args()
    target = {"target.path": os.path.join(PYCODE, "target")}
    drafters = {key: path for key, path in (("eagle.path", args.eagle), ("draft.path", args.draft)) if path}
    auto = specdec.load("auto", **target, **drafters)
    plain = specdec.load("autoregressive", **target)
    if args.prompt_set == "preset":
        prompts, new_tokens = preset_prompts(auto.tokenizer)
    else:
        prompts, new_tokens = held_out_prompts(auto.tokenizer, args.prompts), 128
    sampling = dict(temperature=args.temperature, ignore_eos=True)
    real_mode, real_gate_modes = BatchGate.mode, Auto._gate_modes

    def one_gate(self, state):
        lookup, self.lookup = self.lookup, None           # no lookup: the drafter gate is not made
        try:
            return real_gate_modes(self, state)
        finally:
            self.lookup = lookup

    def run(variant: str) -> float:
        sd = plain if variant == "autoregressive" else auto
        auto.strategy.batch_gates, auto.strategy.drafter_gates = {}, {}
        auto.strategy.use_batch_gate = variant != "auto-no-gate"
        BatchGate.mode = (lambda self, row, draining=False: False) if variant == "auto-plain" else real_mode
        Auto._gate_modes = one_gate if variant == "auto-one-gate" else real_gate_modes
        try:
            sd.generate(prompts[: args.batch], max_new_tokens=8, batch_size=args.batch,
                        seed=list(range(args.batch)), **sampling)
            start = time.perf_counter()
            out = sd.generate(prompts, max_new_tokens=new_tokens, batch_size=args.batch, seed=list(range(len(prompts))),
                              **sampling)
            return out.stats.new_tokens / (time.perf_counter() - start)
        finally:
            BatchGate.mode, Auto._gate_modes = real_mode, real_gate_modes

    variants = ["autoregressive", "auto", "auto-one-gate", "auto-plain", "auto-no-gate"]
    rates = {variant: [] for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            rates[variant].append(run(variant))
    print_rates(rates, f"batch {args.batch}, T = {args.temperature:g}, {len(prompts)} {args.prompt_set} prompts, "
                       f"drafters {sorted(drafters) or 'none'}")


if __name__ == "__main__":
    main()
