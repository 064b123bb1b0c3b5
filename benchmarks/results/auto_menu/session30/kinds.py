"""Per kind of step (the slot auto called: eagle, the table, none), steps, tokens kept a step and nodes, in auto's
default (EAGLE + table). demo: the demo's prompt, or the file PROMPT_FILE names."""
import os, sys, time, statistics, collections, torch, specdec, yaml
sys.path.insert(0, os.getcwd())
from specdec.strategies import auto as A
which = sys.argv[1]; specs = sys.argv[2:]
log = collections.defaultdict(lambda: [0, 0, 0, 0.0])
orig = A.Auto.observe
def observe(self, state, result):
    st = self.pending
    kind = "none" if st.slot is None else type(st.slot.drafter).__name__
    reason = getattr(st.slot, "reason", None) if st.slot is not None else None
    e = log[(self._label, kind, str(reason))]
    e[0] += 1; e[1] += len(result.accepted) + 1; e[2] += len(st.keep); e[3] += time.perf_counter() - st.proposed_at
    return orig(self, state, result)
A.Auto.observe = observe
if which == "demo":
    from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
    torch.set_num_threads(1)
    models = choose_models(None, None, None, None, None, [], None)
    prompts = [open(os.environ["PROMPT_FILE"]).read() if os.environ.get("PROMPT_FILE") else DEFAULT_PROMPT]
    def over(n): return load_overrides(n, models, "cpu")
else:
    torch.set_num_threads(2)
    M = os.environ["MODELS"]
    def over(n): return {"target.path": M + "/target", **({"eagle.path": os.environ["EAGLE"]} if os.environ.get("EAGLE") else {})}
sds = {}
for spec in specs:
    label, _, kv = spec.partition(":")
    o = over("auto")
    for item in filter(None, kv.split(";")):
        k, v = item.split("=", 1); o[k] = yaml.safe_load(v)
    sds[label] = specdec.load("auto", **o)
if which != "demo":
    from benchmarks.config import PromptsConfig
    from benchmarks.prompts import build_prompt_sets
    cfg = PromptsConfig(sets=["code"], num=6, tokens=384, seed=0, split=M + "/split.json")
    prompts = [p.token_ids for p in build_prompt_sets(cfg, next(iter(sds.values())).tokenizer, 1024)["code"]]
for r in range(int(os.environ.get("ROUNDS", 2))):
    for label, sd in sds.items():
        A.Auto._label = label
        for p in prompts:
            sd.generate(p, max_new_tokens=128)
for (label, kind, reason), (steps, tokens, nodes, secs) in sorted(log.items()):
    print(f"{label:10s} {kind:16s} {reason:10s} steps {steps:5d} tau {tokens/steps:5.2f} nodes {nodes/steps:5.1f} loop ms {1000*secs/steps:6.2f}")
