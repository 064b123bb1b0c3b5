"""The speculators side of the EAGLE-3 conformance check (scripts/interop/): a side env with
speculators 0.9.0 builds a tiny EAGLE-3 speculator through speculators' own API and runs speculators'
own forward on it. Here only the side script's honesty is checked (shapes; its draft tokens are the
argmax of the logits it reports); the comparison with our drafter builds on these outputs."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from speculators_env import SCRIPTS, side, side_python  # noqa: F401 - a fixture

H, LAYERS, HEADS, KV_HEADS, V, N, I = 64, 4, 4, 2, 256, 96, 128
STEPS, SEQ = 3, 12

pytestmark = pytest.mark.slow


def test_build_and_forward(side_python, tmp_path):
    model_dir, verifier_dir = tmp_path / "eagle3", tmp_path / "verifier"
    built = side(side_python, "build", "--out", str(model_dir), "--verifier", str(verifier_dir),
                 "--seed", "3", "--hidden", str(H), "--layers", str(LAYERS), "--heads", str(HEADS),
                 "--kv-heads", str(KV_HEADS), "--vocab", str(V), "--draft-vocab", str(N),
                 "--intermediate", str(I))
    assert built["speculators"] == "0.9.0"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == N
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(verifier_dir)
    weights = load_file(model_dir / "model.safetensors")
    assert weights["fc.weight"].shape == (H, 3 * H)
    assert weights["lm_head.weight"].shape == (N, H)
    assert weights["d2t"].shape == (N,) and weights["t2d"].shape == (V,)
    assert int(weights["t2d"].sum()) == N
    # d2t is an offset: draft id i stands for target id i + d2t[i], the ids t2d marks, in order
    target_ids = torch.arange(N) + weights["d2t"]
    assert torch.equal(target_ids, torch.nonzero(weights["t2d"]).flatten())

    g = torch.Generator().manual_seed(0)
    inputs = tmp_path / "in.safetensors"
    save_file({"hidden_states": torch.randn(1, SEQ, 3 * H, generator=g),
               "input_ids": torch.randint(0, V, (1, SEQ), generator=g)}, str(inputs))
    out_path = tmp_path / "out.safetensors"
    summary = side(side_python, "forward", "--model", str(model_dir), "--inputs", str(inputs),
                   "--out", str(out_path), "--steps", str(STEPS))
    assert summary["argmax_is_tokens"] is True
    out = load_file(out_path)
    assert torch.equal(out["d2t"], weights["d2t"])
    for k in range(STEPS):
        logits, tokens = out[f"logits_{k}"], out[f"tokens_{k}"]
        assert logits.shape == (SEQ, N) and tokens.shape == (SEQ,)
        assert torch.isfinite(logits).all()
        assert torch.equal(logits.argmax(-1), tokens)
        assert out[f"layer_out_{k}"].shape == (SEQ, H)
    # the steps differ (each feeds back its own layer output and the next teacher-forced ids)
    assert not torch.allclose(out["logits_0"], out["logits_1"])
    # and the semantics README.md states (re-implemented in plain torch) are speculators' own
    proc = subprocess.run([side_python, str(SCRIPTS / "eagle3_semantics_check.py"), "--model", str(model_dir),
                           "--inputs", str(inputs), "--side-out", str(out_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
