"""Verifier.forward on the pycode target, a 10-node tree at a 400-token context: with nothing asked, with EAGLE's
features, with the logits' top-8, with both (interleaved, medians)."""
import os, sys, time, statistics, torch
sys.path.insert(0, os.getcwd())
from transformers import AutoModelForCausalLM
from specdec.verifier import Verifier, top_k_ids
from specdec.tree import CandidateTree
torch.set_num_threads(2)
M = os.environ["MODELS"]
model = AutoModelForCausalLM.from_pretrained(M + "/target", dtype=torch.float32).eval()
v = Verifier(model, row_linear=8)
prompt = torch.randint(0, 1000, (400,)).tolist()
v.prefill(prompt)
tree = CandidateTree(torch.randint(0, 1000, (10,)), (-1, 0, 1, 2, 0, 4, 1, 6, 3, 8))
feature_layers = [int(x) for x in os.environ.get("LAYERS", "-1").split(",")]
def one(features, topk):
    t = time.perf_counter()
    out = v.forward(5, tree, feature_layers if features else None)
    if topk:
        top_k_ids(out.logits, 8)
    dt = time.perf_counter() - t
    v.commit([0])          # keep the pending row only: the cache grows by one, as a rejected step's would
    return dt
modes = [(False, False), (True, False), (False, True), (True, True)]
times = {m: [] for m in modes}
for rep in range(60):
    for m in modes:
        times[m].append(one(*m))
for m in modes:
    print(f"features {m[0]!s:5s} top-8 {m[1]!s:5s} {1000*statistics.median(times[m][10:]):.3f} ms")
