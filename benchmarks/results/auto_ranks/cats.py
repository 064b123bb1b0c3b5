"""tokens a forward and nodes a step of sam or auto, split by whether SAM-Decoding's rule would copy there (a suffix
match of 5 tokens in the context). MODELS=MODELS/pycode python benchmarks/results/auto_ranks/cats.py sam  (or: auto
auto.drafter=token_recycling)"""
import os, sys, collections, torch, specdec
sys.path.insert(0, os.getcwd())
from benchmarks.config import PromptsConfig
from benchmarks.prompts import build_prompt_sets
from specdec.strategies.prompt_lookup import PromptLookup
torch.set_num_threads(2)
M = os.environ["MODELS"]
kind = sys.argv[1]
over = {"target.path": M + "/target"}
for a in sys.argv[2:]:
    k, v = a.split("="); over[k] = v
sd = specdec.load(kind, **over)
cfg = PromptsConfig(sets=["code"], num=6, tokens=384, seed=0, split=M + "/split.json")
prompts = build_prompt_sets(cfg, sd.tokenizer, 1024)["code"]
strat = sd.strategy
cls = type(strat)
side = PromptLookup(min_ngram=5, max_ngram=5, num_tokens=10, max_matches=4)
cats = []
orig_reset, orig_propose = cls.reset, cls.propose
def reset(self, state):
    side.reset(state); return orig_reset(self, state)
def propose(self, state):
    cats.append(bool(side.propose_paths(state)))
    tree = orig_propose(self, state); sizes.append(tree.num_nodes); return tree
cls.reset, cls.propose = reset, propose
acc = collections.defaultdict(list); nod = collections.defaultdict(list)
for rep in range(2):
    for p in prompts:
        cats.clear(); sizes = []
        out = sd.generate(p.token_ids, max_new_tokens=128)
        if rep:
            for c, a, n in zip(cats, out.stats.accepted_lengths, sizes):
                acc[c].append(a + 1); nod[c].append(n)
for c in (True, False):
    print(kind, sys.argv[2:], "copy-step" if c else "table-step", "steps", len(acc[c]), f"tau {sum(acc[c])/len(acc[c]):.2f} nodes {sum(nod[c])/len(nod[c]):.2f}")
