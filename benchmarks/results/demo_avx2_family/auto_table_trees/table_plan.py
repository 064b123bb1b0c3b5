import os, sys, torch, yaml, specdec
sys.path.insert(0, os.getcwd())
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
torch.set_num_threads(1)
models = choose_models(None, None, None, None, None, [], None)
for spec in ("token_recycling", "auto:auto.drafter=token_recycling;auto.more_drafters=[]"):
    name, _, kv = spec.partition(":")
    o = load_overrides(name, models, "cpu")
    for item in filter(None, kv.split(";")):
        k, v = item.split("=", 1); o[k] = yaml.safe_load(v)
    sd = specdec.load(name, **o)
    for _ in range(6): sd.generate(DEFAULT_PROMPT, max_new_tokens=128)
    s = sd.strategy
    table = s if name == "token_recycling" else s.slots[0].drafter
    print("==", spec)
    print(" draft_cost_s", table.draft_cost_s, "profile key", table.costs.key, "row_linear", getattr(table, "row_linear", None))
    print(" costs", [round(table.costs.verify_cost(n) * 1000, 2) for n in (0, 1, 4, 8, 12, 16)])
    print(" accept d0", [round(table.accept_rate(0, r, 0.0), 3) for r in range(4)], "d1", [round(table.accept_rate(1, r, 0.0), 3) for r in range(4)],
          "d2", [round(table.accept_rate(2, r, 0.0), 3) for r in range(3)], "d4", [round(table.accept_rate(4, r, 0.0), 3) for r in range(2)])
    print(" shape nodes", len(table.shape.parents), "sizes", list(table.tree_sizes)[-8:])
    if name != "token_recycling":
        print(" auto costs", [round(s.costs.verify_cost(n) * 1000, 2) for n in (0, 1, 4, 8, 12, 16)], "key", s.costs.key, "scale", s.cost_scale)
