"""auto's drafters side by side, per prompt, with a trace of which drafter each step called and why.

    python scripts/gpu/auto_probe.py MODELS EAGLE DEVICE DTYPE NEW_TOKENS PROMPTS ROUNDS

MODELS holds target/ (with the tokenizer, or draft/ holding it: gpu-pack's layout) and split.json; EAGLE
an EAGLE drafter's folder for that target. Rows, interleaved per prompt: our autoregressive,
token_recycling, auto (its default: EAGLE with the table beside it), auto with the table alone, auto with
EAGLE alone, eagle. Prints per row the median tok/s and per-step split, then for the auto rows the
(drafter, reason) counts per step and per lookup context, the leaders, the draft costs, the verify
profile and the measured rates auto ranked its drafters by. scripts/gpu/auto_probe.sh runs it on the GPU
machine from gpu-pack/ (with gpu-pack/models/eagle)."""
import os, sys, time, collections, statistics
import torch, specdec
from specdec.strategies.auto import Auto
from specdec.benchmarks.pld_check import heldout_prompts
M, EAGLE, DEVICE, DTYPE = sys.argv[1:5]
NEW, NPROMPTS, ROUNDS = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
tokenizer = {"target.tokenizer": f"{M}/draft"} if os.path.isdir(f"{M}/draft") else {}
base = {"target.path": f"{M}/target", **tokenizer, "eagle.path": EAGLE, "device": DEVICE, "dtype": DTYPE}
rows = {"ar": ("autoregressive", {}), "tr": ("token_recycling", {}), "auto": ("auto", {}),
        "auto_tr": ("auto", {"auto.drafter": "token_recycling"}), "auto_eagle": ("auto", {"auto.more_drafters": []}),
        "eagle": ("eagle", {})}
sds = {n: specdec.load(c, **base, **o) for n, (c, o) in rows.items()}
prompts = heldout_prompts(sds["ar"].tokenizer, M, NPROMPTS, 384, 0)
log = collections.defaultdict(list); current = [None]
orig_end = Auto.propose_end
def end(self, state, tree, s):
    t = orig_end(self, state, tree, s)
    slot = self.called
    log[current[0]].append((None if slot is None else slot.key, None if slot is None else slot.reason, t.num_nodes, self.pending.context))
    return t
Auto.propose_end = end
for sd in sds.values():
    sd.generate(prompts[0][1], max_new_tokens=32)
for temp in (0.0, 0.8):
    rates = collections.defaultdict(list); taus = collections.defaultdict(list); split = collections.defaultdict(list)
    for name in sds: log[(name, temp)].clear()
    for r in range(ROUNDS):
        for _, ids in prompts:
            for name, sd in sds.items():
                current[0] = (name, temp)
                if DEVICE == "cuda": torch.cuda.synchronize()
                t0 = time.perf_counter(); out = sd.generate(ids, max_new_tokens=NEW, temperature=temp, seed=r)
                if DEVICE == "cuda": torch.cuda.synchronize()
                dt = time.perf_counter() - t0; s = out.stats
                rates[name].append(s.new_tokens / dt); taus[name].append(s.tokens_per_forward)
                per_step = s.step_split()
                split[name].append((per_step.draft_ms, per_step.verify_ms, per_step.other_ms, per_step.nodes))
    print(f"=== T {temp}")
    for name in sds:
        sp = [statistics.median(x[i] for x in split[name]) for i in range(4)]
        print(f"{name:11s} tok/s median {statistics.median(rates[name]):7.1f} (all {[round(x) for x in rates[name]]}) tau {statistics.median(taus[name]):.2f} "
              f"ms/step draft {sp[0]:.2f} verify {sp[1]:.2f} other {sp[2]:.2f} nodes {sp[3]:.1f}")
    for name in ("auto", "auto_tr", "auto_eagle"):
        c = collections.Counter((k, r) for k, r, _, _ in log[(name, temp)])
        print(" ", name, "steps", len(log[(name, temp)]), dict(c.most_common()))
        ctx = collections.Counter((l[3], l[0]) for l in log[(name, temp)])
        print("   by context", dict(sorted(ctx.items(), key=lambda x: -x[1])[:10]))
for name in ("auto", "auto_tr", "auto_eagle"):
    st = sds[name].strategy
    prof = st.costs_at(1)
    print(name, "leaders", st.leaders, "draft_cost_ms", {s.key: None if s.draft_cost_s is None else round(1e3 * s.draft_cost_s, 2) for s in st.slots},
          "verify_cost(n)/plain", {n: round(prof.verify_cost(n) / prof.verify_cost(0), 2) for n in (1, 4, 8, 16, 32, 64)},
          "plain ms", round(1e3 * prof.verify_cost(0), 2), "cost_scale", round(st.cost_scale, 2))
    for ctx in sorted({c for s in st.slots for c in s.call_values}, key=str):
        print("   ", ctx, {s.key: (lambda m: None if m is None else tuple(round(x, 1) for x in m[:2]))(st.measured_rates(ctx, slot=s)) for s in st.slots})
