"""make demo's pattern, interleaved: per round, for each variant a fresh Speculator called 6 times on make demo's
prompt, the median of calls 1-5 kept (make demo's timed calls), in ms; every output checked identical. A variant is a
strategy name, or auto_old: auto as another commit had it (1 thread, as make demo runs).
    git show COMMIT:strategies/auto.py > strategies/_auto_old.py      (remove it afterwards)
    SPECDEC_HOME=HOME python benchmarks/results/paired_leader/fresh_ab.py 6 auto auto_old token_recycling autoregressive"""
import os, sys, statistics, time, importlib, torch, specdec
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.models import resolve_device, resolve_dtype
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
models = choose_models(None, None, None, None, None, [], None)
N = int(sys.argv[1]); variants = sys.argv[2:]
def make(v):
    if v == "auto_old":
        o = dict(load_overrides("auto", models, "cpu")); sd0 = specdec.load("auto", **o); cfg = load_spec_config("auto", o)
        mod = importlib.import_module("specdec.strategies._auto_old")
        dev = resolve_device(cfg.device)
        return Speculator(sd0.target, sd0.tokenizer, mod.from_config(cfg, sd0.target, sd0.tokenizer, dev, resolve_dtype(cfg.dtype, dev)), config=cfg)
    return specdec.load(v, **load_overrides(v, models, "cpu"))
res = {v: [] for v in variants}; ref = None
for r in range(N):
    for v in variants:
        sd = make(v); ts = []
        for i in range(6):
            t = time.perf_counter(); out = sd.generate(DEFAULT_PROMPT, max_new_tokens=128, temperature=0.0, ignore_eos=True)
            ts.append((time.perf_counter() - t) * 1e3)
            ref = ref or out.token_ids; assert out.token_ids == ref, v
        res[v].append(statistics.median(ts[1:]))
        print("%-16s" % v, " ".join("%.0f" % t for t in ts), "| med %.0f" % res[v][-1], flush=True)
for v in variants:
    print("%-16s mean of medians %.1f, median %.1f, spread %.0f-%.0f" % (v, statistics.mean(res[v]), statistics.median(res[v]), min(res[v]), max(res[v])))
