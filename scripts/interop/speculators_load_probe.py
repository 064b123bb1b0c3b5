"""What speculators 0.9.0's from_pretrained does when tensors are missing from an EAGLE-3 checkpoint.

    python speculators_load_probe.py --model DIR --verifier VDIR --work TMPDIR   (in the side env)

Copies DIR once per case with some tensors removed (or added, or the verifier path nulled), loads it
with speculators' own loaders, and prints one JSON line per case: loaded or the error, and where
embed_tokens / lm_head came from (checkpoint, verifier, nan, other = neither: uninitialised memory).
Needs DIR built with a draft vocab (N != V) by `speculators_side.py build`.
"""
import argparse
import json
import os
import shutil
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a null verifier path must fail fast, not retry the hub

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from speculators import SpeculatorModel, SpeculatorModelConfig  # noqa: E402

ap = argparse.ArgumentParser(description="speculators from_pretrained with tensors missing")
ap.add_argument("--model", required=True, type=Path)
ap.add_argument("--verifier", required=True, type=Path)
ap.add_argument("--work", required=True, type=Path)
args = ap.parse_args()
SRC = args.model; VER = load_file(str(args.verifier / "model.safetensors"))
full = load_file(SRC / "model.safetensors")
cases = {
    "complete": ([], {}, None),
    "no_embed_tokens": (["embed_tokens.weight"], {}, None),
    "no_lm_head": (["lm_head.weight"], {}, None),
    "no_d2t_t2d": (["d2t", "t2d"], {}, None),
    "no_t2d": (["t2d"], {}, None),
    "no_fc": (["fc.weight"], {}, None),
    "no_norm": (["norm.weight"], {}, None),
    "extra_verifier_keys": ([], {"verifier_lm_head.weight": torch.zeros_like(full["lm_head.weight"]), "verifier_norm.weight": torch.ones_like(full["norm.weight"])}, None),
    "no_embed_verifier_null": (["embed_tokens.weight"], {}, "null"),
    "no_d2t_t2d_verifier_null": (["d2t", "t2d"], {}, "null"),
}
for name, (drop, extra, ver) in cases.items():
    d = args.work / name
    shutil.rmtree(d, ignore_errors=True); shutil.copytree(SRC, d)
    sd = {k: v for k, v in full.items() if k not in drop}; sd.update(extra)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    if ver == "null":
        c = json.loads((d / "config.json").read_text()); c["speculators_config"]["verifier"]["name_or_path"] = None
        (d / "config.json").write_text(json.dumps(c))
    res = {"case": name}
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            cfg = SpeculatorModelConfig.from_pretrained(str(d))
            cfg.transformer_layer_config._attn_implementation = "eager"
            m = SpeculatorModel.from_pretrained(str(d), config=cfg, dtype=torch.float32)
        res["loaded"] = True
        res["warnings"] = sorted({str(w.message)[:160] for w in ws if "missing" in str(w.message).lower() or "not" in str(w.message).lower()})[:3]
        emb = m.embed_tokens.weight
        res["embed"] = ("nan" if emb.isnan().any() else "checkpoint" if "embed_tokens.weight" in sd and torch.equal(emb, sd["embed_tokens.weight"])
                        else "verifier" if torch.equal(emb, VER["model.embed_tokens.weight"]) else "other")
        lm = m.lm_head.weight
        vl = VER["lm_head.weight"][m.t2d] if m.t2d is not None and m.t2d.any() else VER["lm_head.weight"]
        res["lm_head"] = ("nan" if lm.isnan().any() else "checkpoint" if "lm_head.weight" in sd and torch.equal(lm, sd["lm_head.weight"])
                          else "verifier[t2d]" if lm.shape == vl.shape and torch.equal(lm, vl) else "other")
        res["d2t_all_zero"] = bool((m.d2t == 0).all()) if m.d2t is not None else None
        res["t2d_sum"] = int(m.t2d.sum()) if m.t2d is not None else None
        if "fc.weight" in drop: res["fc_is_random_init"] = not torch.equal(m.fc.weight, full["fc.weight"])
        if "norm.weight" in drop: res["norm_weight_all_one"] = bool((m.norm.weight == 1).all())
    except Exception as e:
        res["loaded"] = False; res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(res), flush=True)
