"""Is our attention slower because the cache's keys and values are views? The same one-token verify with _views made
contiguous copies (a probe, not a fix: the copies cost their own time), torch.profiler's attention time per forward."""
import os, sys, time, statistics, torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, os.getcwd())
from transformers import AutoModelForCausalLM
from specdec.verifier import Verifier
from specdec.tree import CandidateTree
from specdec import cache as C
torch.set_num_threads(1)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
prompt = torch.randint(0, 2000, (200,)).tolist()
real_views = C.BufferedLayer._views
def contiguous_views(self):
    real_views(self)
    self.keys, self.values = self.keys.contiguous(), self.values.contiguous()
for mode in ("views", "contiguous", "views"):
    C.BufferedLayer._views = real_views if mode == "views" else contiguous_views
    v = Verifier(model, row_linear=8); v.prefill(prompt)
    empty = CandidateTree.empty("cpu")
    def ours():
        v.forward(5, empty); v.commit([0])
    for _ in range(30): ours()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): ours()
    sdpa = sum(e.self_cpu_time_total for e in prof.key_averages() if "scaled_dot_product_flash" in e.key) / 50
    ts = []
    for _ in range(100):
        s = time.perf_counter(); ours(); ts.append(time.perf_counter() - s)
    print(f"{mode:10s} attention {sdpa:6.1f} us a forward, step {1000*statistics.median(ts):.3f} ms")
