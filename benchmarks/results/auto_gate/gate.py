"""Why auto (lookup + the table) left the table uncalled on the demo: per step, its lookup context, whether the table
was called and why (slot.reason), and whether the plan (planned_loss) or the calls (measured_loss) said a call loses;
then the planned and measured rates per context.    SPECDEC_HOME=HOME python benchmarks/results/auto_gate/gate.py"""
import sys, collections, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
from specdec.strategies import auto as A
torch.set_num_threads(1)
models = choose_models(None, None, None, None, None, [], None)
over = load_overrides("auto", models, "cpu"); over["auto.drafter"] = "token_recycling"
sd = specdec.load("auto", **over)
stats = collections.Counter(); losses = collections.defaultdict(list)
orig = A.Auto._call_drafter
def cd(self, state, context, slot=None):
    r = orig(self, state, context, slot)
    s = slot or self.slots[0]
    pl, ml = self.planned_loss(context, s), self.measured_loss(context, s)
    stats[(context, r, s.reason, pl is not None, ml is not None)] += 1
    if pl is not None: losses[(context, "planned")].append(pl)
    if ml is not None: losses[(context, "measured")].append(ml)
    return r
A.Auto._call_drafter = cd
for _ in range(3): sd.generate(DEFAULT_PROMPT, max_new_tokens=128)
stats.clear(); losses.clear()
for _ in range(5): sd.generate(DEFAULT_PROMPT, max_new_tokens=128)
for k, v in sorted(stats.items(), key=str): print(k, v)
for k, v in losses.items(): print(k, len(v), sum(v)/len(v))
st = sd.strategy
slot = st.slots[0]
print("draft_cost_s", slot.draft_cost_s, "verify(0)", st.verify_cost(0), "verify(10)", st.verify_cost(10))
for ctx in slot.plan_with: print(ctx, "with", slot.plan_with[ctx], "without", st.plan_without.get(ctx), "rates", st.planned_rates(ctx, slot), "measured", st.measured_rates(ctx, slot=slot))
