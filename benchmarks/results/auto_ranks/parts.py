"""auto (lookup + the table) on make demo's prompt and family: milliseconds a verify step spent in each part of auto's
propose and observe and of the table's (wrapped timers; 3 warm-up calls, then 5 calls counted).
    SPECDEC_HOME=HOME python benchmarks/results/auto_ranks/parts.py"""
import time, torch, specdec, sys, collections
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
torch.set_num_threads(1)
models = choose_models(None, None, None, None, None, [], None)
over = load_overrides("auto", models, "cpu"); over["auto.drafter"] = "token_recycling"
T = collections.Counter()
def wrapf(owner, name, label):
    f = getattr(owner, name)
    def g(*a, **k):
        s = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - s
    setattr(owner, name, g)
from specdec.strategies import auto as A
from specdec.strategies.token_recycling import TokenRecycling
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import CandidateTree
for n in ["propose", "propose_start", "propose_end", "_estimates", "_pick_slot", "_gate_modes", "observe", "_calibrate", "_record_call", "_trim_order"]:
    wrapf(A.Auto, n, "Auto." + n)
for n in ["plan", "merge_paths", "drafter_steps", "path_reach"]:
    wrapf(A, n, n)
wrapf(TokenRecycling, "propose", "TR.propose"); wrapf(TokenRecycling, "observe", "TR.observe"); wrapf(TokenRecycling, "observe_steps", "TR.observe_steps")
wrapf(PromptLookup, "propose_paths", "PL.propose_paths"); wrapf(CandidateTree, "select", "Tree.select")
sd = specdec.load("auto", **over)
for _ in range(3): sd.generate(DEFAULT_PROMPT, max_new_tokens=128)
T.clear(); steps = 0
for _ in range(5):
    out = sd.generate(DEFAULT_PROMPT, max_new_tokens=128); steps += out.stats.target_forwards
for k, v in sorted(T.items(), key=lambda kv: -kv[1]):
    print(f"{k:22s} {v/steps*1e3:6.3f} ms/step")
