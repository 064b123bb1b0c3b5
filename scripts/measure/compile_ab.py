"""compile: true against eager on the pycode models (first call, then the median of 3 warm calls; outputs
asserted identical): python scripts/measure/compile_ab.py (from the repository root, shared/ beside it)."""
import time, json, torch, specdec
M = "../shared/models/pycode"
src = open(json.__file__.replace("__init__.py", "decoder.py")).read()
res = {}
for cfg in ("autoregressive", "draft_model", "prompt_lookup"):
    for compile in (False, True):
        kw = {"target.path": f"{M}/target", "device": "cpu", "dtype": "float32", "compile": compile}
        if cfg == "draft_model": kw["draft.path"] = f"{M}/draft"
        sd = specdec.load(cfg, **kw)
        ids = sd.tokenizer(src)["input_ids"][:384]
        t = time.perf_counter(); sd.generate(ids, max_new_tokens=64, ignore_eos=True); first = time.perf_counter() - t
        times = []
        for _ in range(3):
            t = time.perf_counter(); out = sd.generate(ids, max_new_tokens=64, ignore_eos=True); times.append(time.perf_counter() - t)
        res[(cfg, compile)] = (first, sorted(times)[1], out.token_ids)
        print(f"{cfg:15s} compile={compile!s:5s} first call {first:6.2f} s, then median {64 / sorted(times)[1]:6.1f} tok/s", flush=True)
    assert res[(cfg, False)][2] == res[(cfg, True)][2]
    print(f"{cfg:15s} compiled / eager tok/s: {res[(cfg, False)][1] / res[(cfg, True)][1]:.2f}, same tokens", flush=True)
