"""Host reads and host writes per verify step, engine / strategy, for every strategy on a tiny model,
counted by tests/host_reads.py (what would be a device sync or a host -> device copy on a GPU):

    python scripts/measure/host_reads_table.py [--batch]

The counter is this checkout's tests/host_reads.py; the library is whichever `specdec` Python imports
(put another checkout's installed copy first on PYTHONPATH to count it: the "before" column of
benchmarks/results/host_syncs/results.md). Each strategy runs once to warm up (per-shape caches,
first-call setup), then the counted call. Numbers are per verify forward (a batch's: per batched
forward) from the call's first proposal on; the call's setup before it (generation_config
processing, prefill, the drafter's reset) is once per call and reported in its own column, as
reads + writes of the engine and the strategy together. --batch: generate([4 prompts]) at batch size 4."""
import argparse
from unittest import mock
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import torch  # noqa: E402
from conftest import noisy_copy, tiny_model  # noqa: E402
from eagle_helpers import random_drafter  # noqa: E402
from host_reads import HostReads  # noqa: E402
import specdec  # noqa: E402
from specdec import Speculator  # noqa: E402
from specdec.heads import HeadsLayout, MedusaHeads  # noqa: E402
from specdec.heads.io import output_vocab  # noqa: E402
from specdec.strategies.autoregressive import Autoregressive  # noqa: E402
from specdec.strategies.draft_model import DraftModel  # noqa: E402
from specdec.strategies.eagle import Eagle  # noqa: E402
from specdec.strategies.medusa import Medusa  # noqa: E402
from specdec.strategies.prompt_lookup import PromptLookup  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--batch", action="store_true", help="4 prompts at batch size 4")
args = parser.parse_args()
torch.set_num_threads(1)
TARGET = tiny_model("llama", seed=1, sharpen=4.0)
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
PROMPTS = [PROMPT, [7, 8, 9, 10, 7, 8, 9], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7], [20, 21, 22, 23, 20, 21, 22]]
MODES = {"greedy": dict(temperature=0.0), "coupled": dict(temperature=0.8, sampler="coupled"),
         "T=0.8": dict(temperature=0.8, sampler="rejection")}


def heads(tc):
    torch.manual_seed(0)
    h = MedusaHeads(HeadsLayout(3, 1, TARGET.config.hidden_size, output_vocab(TARGET), token_conditioned=tc))
    with torch.no_grad():
        for p in h.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return h


DRAFTERS = {
    "autoregressive": lambda: Autoregressive(),
    "prompt_lookup": lambda: PromptLookup(),
    "draft chain γ=4": lambda: DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4),
    "draft tree [3,2,1,1]": lambda: DraftModel(noisy_copy(TARGET, 0.3), branching=[3, 2, 1, 1]),
    "medusa": lambda: Medusa(heads(False), max_nodes=8, top_k=4),
    "medusa conditioned": lambda: Medusa(heads(True), max_nodes=8, top_k=4),
    "eagle": lambda: Eagle(random_drafter(TARGET), max_nodes=16, top_k=4, depth=6),
}
try:
    from specdec.strategies.suffix import Suffix
    DRAFTERS["suffix"] = lambda: Suffix()
except ImportError:
    pass
try:
    from specdec.strategies.auto import Auto
    from specdec.costmodel import CostProfile
    DRAFTERS["auto (lookup + draft)"] = lambda: Auto(PromptLookup(), DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4),
                                                      costs=CostProfile((0, 64), (1.0, 1.5), 0, "fixed"),
                                                      adapt_costs=False, draft_cost_s=0.0)
except ImportError:
    pass

print(f"library: {os.path.dirname(specdec.__file__)}" + ("; batch of 4 prompts, batch_size 4" if args.batch else ""))
print("reads / writes per verify forward from the first proposal on, engine (E) / strategy (S); setup: reads + writes "
      "before it, once per call")
print("| strategy | " + " | ".join(f"{m} reads E / S | {m} writes E / S | {m} setup" for m in MODES) + " |")
print("|---|" + "---|---|---|" * len(MODES))
for name, build in DRAFTERS.items():
    cells = []
    for mode, kw in MODES.items():
        strategy = build()
        sd = Speculator(TARGET, None, strategy)
        prompt = PROMPTS if args.batch else PROMPT
        extra = dict(batch_size=4) if args.batch else {}
        sd.generate(prompt, max_new_tokens=4, ignore_eos=True, seed=0, **kw, **extra)
        cls, propose, setup = type(strategy), type(strategy).propose, {}

        def marked(self, state, propose=propose, setup=setup):
            if not setup:
                setup.update({(kind, area): r.total(area, kind) for kind in ("read", "write")
                              for area in ("engine", "strategy", "other")})
            return propose(self, state)

        with HostReads() as r, mock.patch.object(cls, "propose", marked):   # on the class: a batch copies strategies
            out = sd.generate(prompt, max_new_tokens=32, ignore_eos=True, seed=0, **kw, **extra)
        n = out.stats.target_forwards

        def steps(kind, area):
            return (r.total(area, kind) - setup[(kind, area)]) / n
        cells.append(f"{steps('read', 'engine'):.2f} / {steps('read', 'strategy'):.2f}")
        cells.append(f"{steps('write', 'engine'):.2f} / {steps('write', 'strategy'):.2f}")
        cells.append(f"{sum(v for (k, a), v in setup.items() if k == 'read')} + "
                     f"{sum(v for (k, a), v in setup.items() if k == 'write')}")
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
