"""The demo's auto (EAGLE + the table): per call of make demo's prompt, which leader each step ran (T the table, F EAGLE) and every
change of the leader gate's look state: (probing, confirming) before -> after, the leader it holds, both leaders' rates.
    SPECDEC_HOME=HOME python benchmarks/results/auto_look/trace.py"""
import torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import auto as A
from specdec.strategies import batch_gate as G
torch.set_num_threads(2)
models = choose_models(None, None, None, None, None, [], None)
sd = specdec.load("auto", **load_overrides("auto", models, "cpu"))
log = []
orig = G.BatchGate._next_step
def nxt(self):
    was = (self.probing, getattr(self, "confirming", False))
    orig(self)
    now = (self.probing, getattr(self, "confirming", False))
    if was != now:
        log.append("%d:%s->%s best=%s look=%.0f before=%s T=%.0f F=%.0f" % (self.steps_total, was, now, "T" if self.best else "F", getattr(self, "look_rate", 0),
            "%.0f" % (self.rate_of(self.before) or 0) if hasattr(self, "before") else "-", self.rate(True) or 0, self.rate(False) or 0))
G.BatchGate._next_step = nxt
orig_mode = G.BatchGate.mode
def mode(self, row, draining=False):
    r = orig_mode(self, row, draining); self.steps_total = getattr(self, "steps_total", 0) + 1; seq.append("T" if r else "F"); return r
G.BatchGate.mode = mode
for i in range(6):
    seq = []; log.clear()
    out = sd.generate(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
    print(i, "%.0f ms" % (out.stats.total_time_s * 1e3), "".join(seq)); print("   ", "; ".join(log))
