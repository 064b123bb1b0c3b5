"""Interleaved A/B in one process: auto as another commit had it and as it is, beside token_recycling and sam, every
row's calls in turn for ROUNDS rounds (what the tables and calibrations learn stays across the calls), each row's
tokens/s against token_recycling's in the same round. Every row's text is checked identical to the first row's.

    git show 7455401:strategies/auto.py > strategies/_auto_old.py      # the "OLD" rows
    SPECDEC_HOME=HOME python benchmarks/results/auto_ranks/ab.py demo 15
    python benchmarks/results/auto_ranks/ab.py pycode 8 MODELS/pycode EAGLE
    rm strategies/_auto_old.py
"""
import os, sys, time, statistics, importlib, torch, specdec
sys.path.insert(0, os.getcwd())
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.models import resolve_device, resolve_dtype
which, rounds = sys.argv[1], int(sys.argv[2])
old_mod = importlib.import_module("specdec.strategies._auto_old")
if which == "demo":
    from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
    torch.set_num_threads(1)
    models = choose_models(None, None, None, None, None, [], None)
    def over(name, extra):
        o = load_overrides(name, models, "cpu"); o.update(extra); return o
    prompts = [DEFAULT_PROMPT]
else:
    torch.set_num_threads(2)
    M, EAGLE = sys.argv[3], sys.argv[4]
    def over(name, extra):
        o = {"target.path": M + "/target", "eagle.path": EAGLE}; o.update(extra); return o
    prompts = None
rows = {"tr": ("token_recycling", {}), "sam": ("sam", {}),
        "auto(tr)": ("auto", {"auto.drafter": "token_recycling"}), "auto(eagle+tr)": ("auto", {"auto.drafter": "eagle"})}
sds = {}
base = None
for label, (name, extra) in rows.items():
    sd = specdec.load(name, **over(name, extra))
    sds[label] = sd
    if name == "auto":
        cfg = load_spec_config(name, over(name, extra))
        strat = old_mod.from_config(cfg, sd.target, sd.tokenizer, resolve_device(cfg.device), resolve_dtype(cfg.dtype, resolve_device(cfg.device)))
        sds[label + " OLD"] = Speculator(sd.target, sd.tokenizer, strat, config=cfg)
if prompts is None:
    from benchmarks.config import PromptsConfig
    from benchmarks.prompts import build_prompt_sets
    cfg = PromptsConfig(sets=["code"], num=6, tokens=384, seed=0, split=M + "/split.json")
    prompts = [p.token_ids for p in build_prompt_sets(cfg, sds["tr"].tokenizer, 1024)["code"]]
ref = {}
for label, sd in sds.items():     # warm-up + identity
    outs = [sd.generate(p, max_new_tokens=128).token_ids for p in prompts]
    ref.setdefault("x", outs)
    assert outs == ref["x"], label
rates = {label: [] for label in sds}
for r in range(rounds):
    for label, sd in sds.items():
        t0 = time.perf_counter(); n = 0
        for p in prompts:
            n += sd.generate(p, max_new_tokens=128).stats.new_tokens
        rates[label].append(n / (time.perf_counter() - t0))
for label in sds:
    paired = [a / b for a, b in zip(rates[label], rates["tr"])]
    print(f"{label:18s} median {statistics.median(rates[label]):7.1f} tok/s  x tr: median {statistics.median(paired):.3f}  mean {statistics.mean(paired):.3f}")
