"""The demo's auto (EAGLE + the table) on make demo's prompt, 7 calls of one Speculator: per step whether the table ran
(T), the other drafter led (E) or was looked at (l), and each change of the paired judge's state (table leads,
looking, judging) with the rates it judged by (E: EAGLE's tokens/s, T: the table's on the same steps), the table's
seconds per step and the guesses' bias.
    SPECDEC_HOME=HOME python benchmarks/results/paired_leader/ptrace.py"""
import os, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import paired_leader as P
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
models = choose_models(None, None, None, None, None, [], None)
sd = specdec.load("auto", **load_overrides("auto", models, "cpu"))
seq = []; notes = []
orig = P.PairedLeader.lead
def lead(self):
    before = (self.table_leads, self.looking, self.judging)
    r = orig(self); seq.append("T" if r else ("l" if self.looking else "E"))
    after = (self.table_leads, self.looking, self.judging)
    if before != after:
        pr = self.paired_rates(self.look_pairs if before[2] else list(self.pairs))
        notes.append("%d:%s->%s %s ts=%.2fms bias=%.2f" % (len(seq), before, after, "E %.0f T %.0f" % pr if pr else "-", (self.table_seconds() or 0) * 1e3, self.guess_bias()))
    return r
P.PairedLeader.lead = lead
for i in range(7):
    seq.clear(); notes.clear()
    out = sd.generate(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
    print(i, "%.0f ms tau %.2f" % (out.stats.total_time_s * 1e3, out.stats.tokens_per_forward), "".join(seq)); print("   ", "; ".join(notes))
