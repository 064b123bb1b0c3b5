"""Offline replay behind suffix's CPU defaults: greedy references of the target on the bench's code /
grounded / noise prompts, then each proposer along them - what it drafts each step (tree nodes), how
many of them the greedy verifier would keep - with no cross-call cache. Token counts are exact; the
"est x AR" column prices each step with a verify-cost profile (relative to a plain step) and leaves
drafting time out; propose+observe and reset are this process's timings.
benchmarks/results/suffix/README.md has what it measured.

    python scripts/measure/suffix_replay.py --models MODELS/pycode [--num 6] [--tokens 128] [--refs refs.json]

--models is the folder of the pycode models (target/, tokenizer/, split.json); --refs keeps the greedy
references in a JSON file, made on the first run and read on the next ones.
"""
import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)          # benchmarks/ lives at the repository root, not in the package
# v(n) / v(0) on a 2-core CPU (docs/benchmarks.md: 1-3 nodes 1.31 / 1.43 / 1.43, 4-5 1.19 / 1.16,
# 8-11 1.38-1.39), the gaps filled in; and a flat one: any tree costs 1.2 plain steps + 0.02 a node
DOC_COSTS = [1.0, 1.31, 1.43, 1.43, 1.19, 1.16, 1.3, 1.35, 1.38, 1.38, 1.38, 1.39, 1.42, 1.45, 1.48, 1.5, 1.52]
FLAT_COSTS = [1.0] + [1.2 + 0.02 * n for n in range(1, 40)]


def references(models, num, tokens, path):
    """{set name: [(prompt ids, the target's greedy continuation ids)]}, read from `path` if it exists."""
    if path and os.path.exists(path):
        with open(path) as f:
            return {name: [(prompt, ref) for prompt, ref in items] for name, items in json.load(f).items()}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from benchmarks.config import PromptsConfig
    from benchmarks.prompts import build_prompt_sets
    tok = AutoTokenizer.from_pretrained(os.path.join(models, "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(models, "target")).eval()
    cfg = PromptsConfig(sets=["code", "grounded", "noise"], num=num, tokens=256, seed=0,
                        split=os.path.join(models, "split.json"))
    refs = {}
    for name, prompts in build_prompt_sets(cfg, tok, 2048).items():
        refs[name] = []
        for p in prompts:
            ids = torch.tensor([p.token_ids])
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
            refs[name].append((list(p.token_ids), out[0, ids.shape[1]:].tolist()))
    if path:
        with open(path, "w") as f:
            json.dump(refs, f)
    return refs


def accepted(tree, ref_next):
    toks, parents, node, n = tree.tokens.tolist(), tree.parents, -1, 0
    while n < len(ref_next):
        kids = [i for i, p in enumerate(parents) if p == node and toks[i] == ref_next[n]]
        if not kids:
            break
        node, n = kids[0], n + 1
    return n


def replay(make, label, refs):
    from specdec.types import DecodeState, StepResult
    for set_name, items in refs.items():
        t = dict(steps=0, nodes=0, acc=0, drafts=0, time=0.0, reset=0.0, doc=0.0, flat=0.0)
        new = sum(len(r) - 1 for _, r in items)
        for prompt, ref in items:
            s = make()
            state = DecodeState(token_ids=prompt + ref[:1], prompt_len=len(prompt), sampling=None, rng=None,
                                max_depth=len(ref))
            start = time.perf_counter(); s.reset(state); t["reset"] += time.perf_counter() - start
            i = 0                                      # ref[:i + 1] committed, ref[i] pending
            while i + 1 < len(ref):
                state.token_ids, state.max_depth = prompt + ref[:i + 1], len(ref) - i - 1
                start = time.perf_counter(); tree = s.propose(state); t["time"] += time.perf_counter() - start
                n = tree.num_nodes
                a = accepted(tree, ref[i + 1:]) if n else 0
                t["steps"] += 1; t["nodes"] += n; t["acc"] += a; t["drafts"] += n > 0
                t["doc"] += DOC_COSTS[min(n, len(DOC_COSTS) - 1)]; t["flat"] += FLAT_COSTS[min(n, len(FLAT_COSTS) - 1)]
                i += a + 1
                state.token_ids = prompt + ref[:i + 1]
                result = StepResult(tree, tuple(range(a)), ref[min(i, len(ref) - 1)], len(state.token_ids) - a - 1)   # (only the count
                start = time.perf_counter(); s.observe(state, result); t["time"] += time.perf_counter() - start  # matters)
        st = t["steps"]
        print(f"{label:34s} {set_name:9s} steps {st:4d}  tau {new / st:.2f}  nodes/step {t['nodes'] / st:5.2f}  "
              f"drafts on {t['drafts'] / st:.2f} of steps  kept/node {t['acc'] / max(t['nodes'], 1):.2f}  "
              f"est x AR {new / t['doc']:.2f} (flat {new / t['flat']:.2f})  "
              f"propose+observe {1000 * t['time'] / st:.2f} ms/step  reset {1000 * t['reset'] / len(items):.1f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="the pycode models' folder (target/, tokenizer/, split.json)")
    ap.add_argument("--num", type=int, default=6, help="prompts per set")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens of each greedy reference")
    ap.add_argument("--refs", default=None, help="keep the greedy references in this JSON file")
    args = ap.parse_args(argv)
    from specdec.strategies.prompt_lookup import PromptLookup
    from specdec.strategies.suffix import Suffix
    refs = references(args.models, args.num, args.tokens, args.refs)
    rows = [("prompt_lookup", lambda: PromptLookup()),
            ("suffix (defaults)", lambda: Suffix(max_cached_tokens=0)),
            ("suffix min_gain=0 (no gate)", lambda: Suffix(max_cached_tokens=0, min_gain=0.0))]
    for m in (1, 2, 3):
        for f in (1.0, 4.0, 6.0, 8.0):
            rows.append((f"suffix min_match={m} factor={f:g}",
                         lambda m=m, f=f: Suffix(max_cached_tokens=0, min_match=m, max_spec_factor=f)))
    for label, make in rows:
        replay(make, label, refs)


if __name__ == "__main__":
    main()
