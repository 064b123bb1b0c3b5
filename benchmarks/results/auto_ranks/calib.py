"""Per verified node of auto (lookup + the table) whose parent was kept: its estimate against how often it was kept,
by calibration source (key name), whether its sibling group mixed sources, and depth. 6 unseen code prompts x 2,
the second round counted.  MODELS=MODELS/pycode python benchmarks/results/auto_ranks/calib.py"""
import os, sys, collections, torch, specdec
sys.path.insert(0, os.getcwd())
from benchmarks.config import PromptsConfig
from benchmarks.prompts import build_prompt_sets
from specdec.strategies import auto as A
torch.set_num_threads(2)
M = os.environ["MODELS"]
kind = sys.argv[1] if len(sys.argv) > 1 else "auto"
sd = specdec.load(kind, **{"target.path": M + "/target"})
cfg = PromptsConfig(sets=["code"], num=6, tokens=384, seed=0, split=M + "/split.json")
prompts = build_prompt_sets(cfg, sd.tokenizer, 1024)["code"]
est_sum = collections.defaultdict(float); kept_sum = collections.defaultdict(float); n = collections.Counter()
orig_est, orig_cal = A.Auto._estimates, A.Auto._calibrate
def est(self, *a, **k):
    r = orig_est(self, *a, **k); self._last_est = r[0]; return r
def cal(self, merged, keys, keep, accepted):
    accept = self._last_est
    kept = set(accepted)
    depths = merged.depths()
    for node in keep:
        p = merged.parents[node]
        if p != -1 and p not in kept: continue
        group = merged.children(p)
        srcs = {keys[c][0][0].rstrip("+").rstrip("^") for c in group if c in keep}
        src = keys[node][0][0]
        cat = (src, "mixed" if len(srcs) > 1 else "alone", min(depths[node], 3))
        est_sum[cat] += accept[node]; kept_sum[cat] += node in kept; n[cat] += 1
    return orig_cal(self, merged, keys, keep, accepted)
A.Auto._estimates, A.Auto._calibrate = est, cal
steps = toks = nodes = 0
for rep in range(2):
    for p in prompts:
        out = sd.generate(p.token_ids, max_new_tokens=128)
        if rep: steps += out.stats.target_forwards; toks += out.stats.new_tokens; nodes += out.stats.proposed_nodes
print(f"tau {toks/steps:.2f} nodes/step {nodes/steps:.2f}")
for cat in sorted(n):
    print(cat, n[cat], f"est {est_sum[cat]/n[cat]:.3f} kept {kept_sum[cat]/n[cat]:.3f}")
