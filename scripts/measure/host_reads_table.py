"""Host reads per verify step, engine / strategy, for every strategy on a tiny model (tests/host_reads.py):
    python scripts/measure/host_reads_table.py REPO_ROOT"""
import sys
repo = sys.argv[1]
sys.path.insert(0, f"{repo}/tests")
import torch
from conftest import noisy_copy, tiny_model
from eagle_helpers import random_drafter
from host_reads import HostReads
from specdec import Speculator
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.heads.io import output_vocab
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup
torch.set_num_threads(1)
TARGET = tiny_model("llama", seed=1, sharpen=4.0)
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
MODES = {"greedy": dict(temperature=0.0), "coupled": dict(temperature=0.8, sampler="coupled"),
         "T=0.8": dict(temperature=0.8, sampler="rejection")}
def heads(tc):
    torch.manual_seed(0)
    h = MedusaHeads(HeadsLayout(3, 1, TARGET.config.hidden_size, output_vocab(TARGET), token_conditioned=tc))
    with torch.no_grad():
        for p in h.parameters(): p.add_(0.3 * torch.randn_like(p))
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
    from specdec.strategies.auto import Auto
    from specdec.costmodel import CostProfile
    DRAFTERS["auto (lookup + draft)"] = lambda: Auto(PromptLookup(), DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4),
                                                      costs=CostProfile((0, 64), (1.0, 1.5), 0, "fixed"), adapt_costs=False, draft_cost_s=0.0)
except ImportError:
    pass
print("| strategy | " + " | ".join(f"{m} engine / strategy" for m in MODES) + " |")
for name, build in DRAFTERS.items():
    cells = []
    for mode, kw in MODES.items():
        sd = Speculator(TARGET, None, build())
        sd.generate(PROMPT, max_new_tokens=4, ignore_eos=True, seed=0, **kw)
        with HostReads() as r:
            out = sd.generate(PROMPT, max_new_tokens=32, ignore_eos=True, seed=0, **kw)
        a = r.by_area(); n = out.stats.target_forwards
        cells.append(f"{a.get('engine', 0)/n:.2f} / {a.get('strategy', 0)/n:.2f}")
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
