"""Interleaved in one process: for each value of LEADER_HOLD in turn, a fresh demo auto Speculator called 6 times, the
median of calls 1-5 kept (make demo's timed calls); N rounds. LEADER_HOLD was a trial (auto_look/README.md): a hurdle
the second leader had to clear to take over (BatchGate(hold=...)), not in the code now.
    SPECDEC_HOME=HOME python benchmarks/results/auto_look/hold_ab.py 6 0 0.3"""
import os, sys, statistics, time, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import auto as A
torch.set_num_threads(2)
models = choose_models(None, None, None, None, None, [], None)
N = int(sys.argv[1]); holds = [float(h) for h in sys.argv[2:]]
res = {h: [] for h in holds}
for r in range(N):
    for h in holds:
        A.LEADER_HOLD = h
        sd = specdec.load("auto", **load_overrides("auto", models, "cpu"))
        ts = []
        for i in range(6):
            t = time.perf_counter(); sd.generate(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
            ts.append((time.perf_counter() - t) * 1e3)
        res[h].append(statistics.median(ts[1:]))
        print(h, " ".join("%.0f" % t for t in ts), "| med %.0f" % res[h][-1], flush=True)
for h in holds:
    print("hold %.2f: mean of medians %.1f, median %.1f, spread %.0f-%.0f" % (h, statistics.mean(res[h]), statistics.median(res[h]), min(res[h]), max(res[h])))
