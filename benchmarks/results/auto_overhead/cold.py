"""How long a few host operations take inside the generation loop, between two verify forwards, the first time and
again right after: token_recycling's host read of its table (draft_tokens), timed piece by piece.

    SPECDEC_HOME=HOME python benchmarks/results/auto_overhead/cold.py     (the demo's family, 1 thread)
"""
import collections, os, sys, time, torch, specdec
sys.path.insert(0, os.getcwd())
from specdec.family.demo import choose_models, load_overrides, DEFAULT_PROMPT
import specdec.strategies.token_recycling as recycling

torch.set_num_threads(1)
seconds, calls = collections.defaultdict(float), 0


def timed(label, fn):
    start = time.perf_counter()
    out = fn()
    seconds[label] += time.perf_counter() - start
    return out


def draft_tokens(table, pending, index):
    global calls
    calls += 1
    rows = timed("table.numpy()", table.numpy)
    timed("table.numpy() again", table.numpy)
    held = [timed("int(pending)", lambda: int(pending))]
    timed("int(pending) again", lambda: int(pending))
    for parent_row, rank in index.host:
        held.append(int(rows[held[parent_row], rank]))
    out = timed("torch.tensor(tokens)", lambda: torch.tensor(held[1:], dtype=torch.long))
    timed("torch.tensor(tokens) again", lambda: torch.tensor(held[1:], dtype=torch.long))
    return out


recycling.draft_tokens = draft_tokens
models = choose_models(None, None, None, None, None, [], None)
sd = specdec.load("token_recycling", **load_overrides("token_recycling", models, "cpu"))
for _ in range(10):
    sd.generate(DEFAULT_PROMPT, max_new_tokens=128, ignore_eos=True)
for label, total in seconds.items():
    print(f"{label:28s} {1e6 * total / calls:6.1f} us a call ({calls} calls)")
