"""Rows in one process, interleaved: every row's calls in turn for ROUNDS rounds (what tables and calibrations learn
stays across calls), each row's tokens/s against the first row's in the same round (median and mean of the rounds),
with its tokens per forward and nodes per step. Every row's text is checked identical to the first row's.

    SPECDEC_HOME=HOME python benchmarks/results/auto_gate/rows.py demo 12 "tr=token_recycling" "auto(tr)=auto:auto.drafter=token_recycling"
    MODELS=MODELS/pycode EAGLE=EAGLE python benchmarks/results/auto_gate/rows.py pycode 6 "tr=token_recycling" ...

A row is label=strategy[:key=value;key=value]; strategy auto_old is auto as another commit had it:
    git show COMMIT:strategies/auto.py > strategies/_auto_old.py     (remove it afterwards)
With PATCH=FILE, a row labelled old_* runs inside FILE's undone() (a context manager: a change undone by patching,
benchmarks/results/auto_overhead/undone.py), only while that row runs.
demo: the default family (make demo's prompt, 1 thread); pycode: 6 unseen code prompts of 384 tokens (2 threads).
Each row also prints its per-step split (stats.step_split: draft / verify / other ms per verify step).
"""
import contextlib, importlib.util, os, sys, time, statistics, torch, yaml, specdec
sys.path.insert(0, os.getcwd())
which, rounds, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
if which == "demo":
    from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
    torch.set_num_threads(1)
    models = choose_models(None, None, None, None, None, [], None)
    def over(name): return load_overrides(name, models, "cpu")
    prompts = [DEFAULT_PROMPT]
else:
    torch.set_num_threads(2)
    M = os.environ["MODELS"]
    def over(name): return {"target.path": M + "/target", **({"eagle.path": os.environ["EAGLE"]} if os.environ.get("EAGLE") else {})}
    prompts = None
sds = {}
for spec in specs:
    label, rest = spec.split("=", 1)
    name, _, kv = rest.partition(":")
    o = over("auto" if name == "auto_old" else name)
    for item in filter(None, kv.split(";")):
        k, v = item.split("=", 1)
        o[k] = yaml.safe_load(v)           # 4 -> int, [] or [a, b] -> a list, true -> bool, a path -> str
    if name == "auto_old":
        import importlib
        from specdec import Speculator
        from specdec.config import load_spec_config
        from specdec.models import resolve_device, resolve_dtype
        o2 = dict(o); sd0 = specdec.load("auto", **o2)
        cfg = load_spec_config("auto", o2)
        mod = importlib.import_module("specdec.strategies._auto_old")
        strat = mod.from_config(cfg, sd0.target, sd0.tokenizer, resolve_device(cfg.device), resolve_dtype(cfg.dtype, resolve_device(cfg.device)))
        sds[label] = Speculator(sd0.target, sd0.tokenizer, strat, config=cfg)
    else:
        sds[label] = specdec.load(name, **o)
if prompts is None:
    from benchmarks.config import PromptsConfig
    from benchmarks.prompts import build_prompt_sets
    cfg = PromptsConfig(sets=["code"], num=6, tokens=384, seed=0, split=M + "/split.json")
    prompts = [p.token_ids for p in build_prompt_sets(cfg, next(iter(sds.values())).tokenizer, 1024)["code"]]
patch = None
if os.environ.get("PATCH"):
    spec = importlib.util.spec_from_file_location("rows_patch", os.environ["PATCH"])
    patch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patch)


def generate(label, sd, prompt):
    with patch.undone() if patch is not None and label.startswith("old_") else contextlib.nullcontext():
        return sd.generate(prompt, max_new_tokens=128)


ref = None
for label, sd in sds.items():
    outs = [generate(label, sd, p).token_ids for p in prompts]
    ref = ref or outs
    assert outs == ref, label
rates = {l: [] for l in sds}; nodes = {l: [] for l in sds}; tau = {l: [] for l in sds}; split = {l: [] for l in sds}
for r in range(rounds):
    for label, sd in sds.items():
        t0 = time.perf_counter(); n = f = pn = 0; ms = [0.0, 0.0, 0.0]
        for p in prompts:
            st = generate(label, sd, p).stats
            n += st.new_tokens; f += st.target_forwards; pn += st.proposed_nodes
            part = st.step_split()
            ms = [total + x * st.target_forwards for total, x in zip(ms, (part.draft_ms, part.verify_ms, part.other_ms))]
        rates[label].append(n / (time.perf_counter() - t0)); tau[label].append(n / f); nodes[label].append(pn / f)
        split[label].append([x / f for x in ms])
first = specs[0].split("=", 1)[0]
for label in sds:
    paired = [a / b for a, b in zip(rates[label], rates[first])]
    draft, verify, other = (statistics.mean(row[i] for row in split[label]) for i in range(3))
    print(f"{label:22s} {statistics.median(rates[label]):7.1f} tok/s  x {first}: median {statistics.median(paired):.3f} mean {statistics.mean(paired):.3f}  tau {statistics.mean(tau[label]):.2f} nodes {statistics.mean(nodes[label]):.1f}"
          f"  draft {draft:.2f} verify {verify:.2f} other {other:.2f} ms/step")
