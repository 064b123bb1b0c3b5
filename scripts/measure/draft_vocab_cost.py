"""Time of one EAGLE-3 drafter forward over a tree level (`rows` nodes after `past` committed rows,
logits scattered into the target vocabulary, as the eagle strategy runs it) for several draft
vocabulary sizes, on a target's shape (random drafter weights: the cost does not depend on them).

    python scripts/measure/draft_vocab_cost.py --target ../shared/models/pycode/target --sizes 4096 2048 1024

Rounds interleave the sizes, so a machine whose load changes slows every size alike; the median
of the rounds is printed per size, and its ratio to the first size."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.cache import BufferedLayer
from specdec.heads.eagle import eagle3_layers
from specdec.heads.eagle3 import Eagle3Drafter, eagle3_layout_for_target
from specdec.models import load_model


@torch.inference_mode()
def level_seconds(drafter, rows: int, past: int, repeats: int) -> float:
    width = drafter.layout.width
    cache = BufferedLayer()
    drafter(torch.randn(1, past, width), torch.zeros(1, past, dtype=torch.long), torch.arange(past)[None],
            with_logits=False, cache=cache, start=0)
    g, tokens = torch.randn(1, rows, width), torch.zeros(1, rows, dtype=torch.long)
    positions = torch.full((1, rows), past)
    start = time.perf_counter()
    for _ in range(repeats):
        _, logits, _, _ = drafter(g, tokens, positions, cache=cache, start=past)
        logits.topk(4, dim=-1)                    # what the tree builder reads
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 2048, 1024])
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--past", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    target = load_model(args.target, "target", torch.device("cpu"), torch.float32)
    layers = eagle3_layers(int(target.config.num_hidden_layers))
    drafters = {}
    for size in args.sizes:
        drafter = Eagle3Drafter(eagle3_layout_for_target(target, layers, size, args.intermediate_size)).eval()
        drafter.set_draft_vocab(torch.randperm(drafter.layout.vocab_size)[:size].sort().values)
        drafter.attach_embedding(target.get_input_embeddings())
        drafters[size] = drafter
    times = {size: [] for size in args.sizes}
    for _ in range(args.rounds):
        for size, drafter in drafters.items():
            times[size].append(level_seconds(drafter, args.rows, args.past, args.repeats))
    first = statistics.median(times[args.sizes[0]])
    print(f"threads {torch.get_num_threads()}, rows {args.rows}, past {args.past}, vocabulary "
          f"{drafters[args.sizes[0]].layout.vocab_size}, intermediate {args.intermediate_size}")
    print("| draft_vocab_size | ms per tree-level forward (median of rounds) | vs first |")
    print("|---:|---:|---:|")
    for size in args.sizes:
        median = statistics.median(times[size])
        print(f"| {size} | {1e3 * median:.3f} | {median / first:.2f} |")


if __name__ == "__main__":
    main()
