"""Small linear weights (below specdec.row_linear.CACHED_WEIGHT) twinned or left alone, two ways:

  kernels  each product of a small layer of the default family's target as it was before c7df314 (128 x 8:
           128 x 128, 344 x 128, 128 x 344), and of its 2048 x 128 output layer, at 1 to 9 rows: PyTorch's
           own (F.linear), the twin's weight @ input.T and oneDNN's on a packed copy; microseconds, medians of
           5 rounds
  generate the demo's prompt completed by each strategy with its Speculator built twice in one process:
           small layers twinned as before ("old": every float32 linear layer) and left alone ("new", the
           rule now); every Speculator's call in turn, rounds interleaved, the median tokens/s kept

    python scripts/measure/small_weights.py kernels [--threads 1]
    python scripts/measure/small_weights.py generate [--family DIR] [--threads 1] [--rounds 9]

--family: a family folder (DIR/target, DIR/draft, DIR/heads, DIR/eagle); default the embedded default
family, built first if missing. The demo times the default family on one thread, hence the default.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch
from torch import nn
from torch.nn import functional as F

from timing import median_seconds


def median_us(call) -> float:
    return median_seconds(call, calls=2000, rounds=5, warmup=200) * 1e6


def kernels() -> None:
    for out_features, in_features in ((128, 128), (344, 128), (128, 344), (2048, 128)):
        weight = torch.randn(out_features, in_features)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
        for rows in (1, 2, 4, 7, 9):
            x = torch.randn(1, rows, in_features)
            ways = {"F.linear": lambda: F.linear(x, weight),
                    "weight @ input.T": lambda: torch.mm(weight, x[0].t()).t(),
                    "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")}
            print(f"{out_features:>5} x {in_features:<4} rows {rows}  " +
                  "  ".join(f"{name} {median_us(call):6.1f}" for name, call in ways.items()), flush=True)


def twin_every_layer(module: nn.Module, pack: bool) -> bool:
    """The rule before: every plain float32 CPU nn.Linear twinned, whatever its size."""
    import specdec.row_linear as row_linear
    if type(module) is not nn.Linear or module.weight.device.type != "cpu":
        return False
    dtype = module.weight.dtype
    return dtype == torch.float32 or (pack and dtype == torch.bfloat16 and row_linear.worth_packing(module))


def generate(family: str | None, rounds: int, strategies: list[str]) -> None:
    import specdec
    import specdec.row_linear as row_linear
    from specdec.family.demo import DEFAULT_PROMPT, DemoModels, load_overrides
    if family is None:
        from specdec.family.defaults import default_family
        family = os.path.dirname(default_family().target)
    models = DemoModels(f"{family}/target", f"{family}/draft", f"{family}/heads", "family", f"{family}/eagle")
    rule_now = row_linear.qualifies
    speculators = {}
    for name in strategies:
        for tag, rule in (("new", rule_now), ("old", twin_every_layer)):
            row_linear.qualifies = rule                  # read when the Speculator makes its twin
            speculators[(name, tag)] = specdec.load(name, **load_overrides(name, models, "cpu"))
    row_linear.qualifies = rule_now
    call = dict(max_new_tokens=128, temperature=0.0, ignore_eos=True)
    reference = None
    for key, speculator in speculators.items():          # warm-up, and every output the same
        ids = speculator.generate(DEFAULT_PROMPT, **call).token_ids
        reference = reference or ids
        assert ids == reference, f"{key}: another output"
    rates = {key: [] for key in speculators}
    for _ in range(rounds):
        for key, speculator in speculators.items():
            rates[key].append(speculator.generate(DEFAULT_PROMPT, **call).stats.tokens_per_second)
    for name in strategies:
        new, old = (statistics.median(rates[(name, tag)]) for tag in ("new", "old"))
        print(f"{name:>16}  small layers twinned {old:6.1f} tok/s  left alone {new:6.1f} tok/s  ({new / old:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("kernels", "generate"))
    parser.add_argument("--family", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--strategies", default="autoregressive,prompt_lookup,eagle,auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        if args.what == "kernels":
            kernels()
    if args.what == "generate":
        generate(args.family, args.rounds, args.strategies.split(","))


if __name__ == "__main__":
    main()
