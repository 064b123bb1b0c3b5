"""Our one-token verify against HF's one-token forward on the same target and context (the new family's), op by op."""
import os, sys, time, statistics, torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, os.getcwd())
from transformers import AutoModelForCausalLM, DynamicCache
from specdec.verifier import Verifier
from specdec.tree import CandidateTree
torch.set_num_threads(1)
path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
prompt = torch.randint(0, 2000, (200,)).tolist()
v = Verifier(model, row_linear=8)
v.prefill(prompt)
empty = CandidateTree.empty("cpu")
cache = DynamicCache()
with torch.inference_mode():
    model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
def ours():
    v.forward(5, empty); v.commit([0])
def hf():
    with torch.inference_mode():
        n = cache.get_seq_length()
        model(input_ids=torch.tensor([[5]]), position_ids=torch.tensor([[n]]), past_key_values=cache, use_cache=True)
for _ in range(30): ours(); hf()
t = {"ours": [], "hf": []}
for _ in range(200):
    for name, f in (("ours", ours), ("hf", hf)):
        s = time.perf_counter(); f(); t[name].append(time.perf_counter() - s)
for name in t: print(name, f"{1000*statistics.median(t[name]):.3f} ms")
tabs = {}
for name, f in (("ours", ours), ("hf", hf)):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): f()
    tabs[name] = {e.key: (e.self_cpu_time_total / 50, e.count / 50) for e in prof.key_averages()}
keys = sorted(set(tabs["ours"]) | set(tabs["hf"]), key=lambda k: -abs(tabs["ours"].get(k, (0, 0))[0] - tabs["hf"].get(k, (0, 0))[0]))
print(f"{'op':50s} {'ours us':>8s} {'hf us':>8s} calls ours/hf")
for k in keys[:22]:
    a, b = tabs["ours"].get(k, (0, 0)), tabs["hf"].get(k, (0, 0))
    print(f"{k[:50]:50s} {a[0]:8.1f} {b[0]:8.1f} {a[1]:5.0f} {b[1]:5.0f}")
print("total self", round(sum(x[0] for x in tabs["ours"].values())), round(sum(x[0] for x in tabs["hf"].values())))
