"""make demo's timed calls of one row: N fresh Speculators, each called 6 times on the demo's prompt; the median of calls 1-5
(make demo's five timed calls after its warm-up) per Speculator, in ms.
    SPECDEC_HOME=HOME THREADS=2 python benchmarks/results/auto_look/lead.py N [strategy [key=value ...]]"""
import os, sys, statistics, time, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import auto as A
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
for k in ("LEADER_PROBE_STEPS", "LEADER_MEMORY"):
    if k in os.environ: setattr(A, k, int(os.environ[k]))
if "LEADER_EXPLORE" in os.environ: A.LEADER_EXPLORE = float(os.environ["LEADER_EXPLORE"])
models = choose_models(None, None, None, None, None, [], None)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4
meds = []
for r in range(N):
    sd = specdec.load(sys.argv[2] if len(sys.argv) > 2 else "auto", **load_overrides(sys.argv[2] if len(sys.argv) > 2 else "auto", models, "cpu"), **dict(a.split("=", 1) for a in sys.argv[3:]))
    ts = []
    for i in range(6):
        t = time.perf_counter(); sd.generate(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
        ts.append((time.perf_counter() - t) * 1e3)
    meds.append(statistics.median(ts[1:]))
    print(" ".join("%.0f" % t for t in ts), "| med %.0f" % meds[-1], flush=True)
print("median of medians %.0f, spread %.0f-%.0f" % (statistics.median(meds), min(meds), max(meds)))
