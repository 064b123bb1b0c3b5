"""Each row's tokens per step and tokens/s by the step's place in the call (buckets of 8 steps; the call's first step
left out), over calls 1-5 of one Speculator on make demo's prompt, 1 thread as make demo runs.
    SPECDEC_HOME=HOME python benchmarks/results/auto_look/pos.py"""
import sys, time, collections, torch, specdec
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
torch.set_num_threads(1)
models = choose_models(None, None, None, None, None, [], None)
rows = {"auto(table)": ("auto", {"auto.drafter": "token_recycling"}), "auto(eagle)": ("auto", {"auto.more_drafters": None}),
        "eagle": ("eagle", {}), "table": ("token_recycling", {})}
for label, (name, kv) in rows.items():
    o = dict(load_overrides(name, models, "cpu")); o.update(kv)
    if kv.get("auto.more_drafters", 1) is None:
        o["auto.more_drafters"] = []
    sd = specdec.load(name, **o)
    tok = collections.defaultdict(float); sec = collections.defaultdict(float); n = collections.Counter()
    for call in range(6):
        stream = sd.stream(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
        last = time.perf_counter(); step = 0; had = 0
        for chunk in stream:
            now = time.perf_counter(); new = stream.stats.new_tokens - had; had = stream.stats.new_tokens
            if call >= 1 and step >= 1:
                b = min(step // 8, 4); tok[b] += new; sec[b] += now - last; n[b] += 1
            last = now; step += 1
    print("%-12s" % label, "  ".join("[%d-%s] %.2f tok/step %.0f tok/s" % (8 * b, "" if b == 4 else 8 * b + 7, tok[b] / n[b], tok[b] / sec[b]) for b in sorted(n)))
