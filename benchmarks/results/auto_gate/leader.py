"""The demo's auto (EAGLE + the table): per call of make demo's prompt, the steps its leader gate ran with the table
leading (True) or EAGLE (False), tokens a forward, the call's time, which leader the gate holds, and both leaders' rates.
    SPECDEC_HOME=HOME python benchmarks/results/auto_gate/leader.py"""
import sys, collections, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import auto as A
torch.set_num_threads(1)
models = choose_models(None, None, None, None, None, [], None)
sd = specdec.load("auto", **load_overrides("auto", models, "cpu"))
counts = collections.Counter()
orig = A.Auto._leader
def leader(self, state):
    r = orig(self, state); counts[r[1]] += 1; return r
A.Auto._leader = leader
for i in range(14):
    counts.clear()
    out = sd.generate(DEFAULT_PROMPT, max_new_tokens=128)
    g = sd.strategy.leader_gates.get("greedy")
    print(i, dict(counts), "tau %.2f" % out.stats.tokens_per_forward, "t %.1f ms" % (out.stats.total_time_s * 1e3),
          "best", g.best if g else None, "rates", [g.rate(m) for m in (True, False)] if g else None)
