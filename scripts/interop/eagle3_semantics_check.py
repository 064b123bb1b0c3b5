"""Checks the EAGLE-3 semantics written in scripts/interop/README.md against speculators itself.

    python eagle3_semantics_check.py --model DIR --inputs IN.safetensors --side-out OUT.safetensors

A from-scratch re-implementation in plain torch (reads only config.json and model.safetensors, no
speculators, no transformers) of what README.md says speculators 0.9.0's TTT forward does; it is
compared with what `speculators_side.py forward` saved. Runs in any env with torch + safetensors.
Exit 0 and one JSON line when every step's logits agree to 1e-4.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama (neox, rotate-half) rotary embedding; x [heads, n, d], pos [n]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference(cfg: dict, w: dict, hidden: torch.Tensor, ids: torch.Tensor, steps: int) -> list:
    tl = cfg["transformer_layer_config"]
    H, nh, nkv = tl["hidden_size"], tl["num_attention_heads"], tl["num_key_value_heads"]
    hd = tl.get("head_dim") or H // nh
    eps, theta = tl["rms_norm_eps"], tl["rope_parameters"]["rope_theta"]
    n_layers = tl["num_hidden_layers"]
    n = ids.shape[0]

    def lin(x, name):
        return x @ w[name].T

    h = lin(hidden, "fc.weight")  # [n, H]
    caches = [([], []) for _ in range(n_layers)]  # per layer: keys/values of every step so far
    out = []
    for k in range(steps):
        # step k reads the ground-truth ids shifted left by k (zero padded), at positions arange(n)+k
        ids_k = torch.cat([ids[k:], ids.new_zeros(k)])
        pos = torch.arange(n) + k
        e = w["embed_tokens.weight"][ids_k]
        x = h
        for li in range(n_layers):
            p = f"layers.{li}."
            if li == 0:
                hn = rms(x, w[p + "hidden_norm.weight"], eps)
                residual = hn if cfg["norm_before_residual"] else x
                a_in = torch.cat([rms(e, w[p + "input_layernorm.weight"], eps), hn], -1)
            else:
                residual = x
                a_in = rms(x, w[p + "input_layernorm.weight"], eps)
            q = lin(a_in, p + "self_attn.q_proj.weight").view(n, nh, hd).transpose(0, 1)
            kk = lin(a_in, p + "self_attn.k_proj.weight").view(n, nkv, hd).transpose(0, 1)
            vv = lin(a_in, p + "self_attn.v_proj.weight").view(n, nkv, hd).transpose(0, 1)
            q, kk = rope(q, pos, theta), rope(kk, pos, theta)
            caches[li][0].append(kk)
            caches[li][1].append(vv)
            K = torch.cat(caches[li][0], 1).repeat_interleave(nh // nkv, 0)  # [nh, (k+1)n, hd]
            Vv = torch.cat(caches[li][1], 1).repeat_interleave(nh // nkv, 0)
            # row i sees step 0's keys 0..i, and its own key (column i) of every later step
            allowed = torch.zeros(n, (k + 1) * n, dtype=torch.bool)
            allowed[:, :n] = torch.ones(n, n, dtype=torch.bool).tril()
            for s in range(1, k + 1):
                allowed[:, s * n:(s + 1) * n] = torch.eye(n, dtype=torch.bool)
            scores = (q @ K.transpose(1, 2)) / math.sqrt(hd)
            scores = scores.masked_fill(~allowed, float("-inf"))
            att = (scores.softmax(-1) @ Vv).transpose(0, 1).reshape(n, nh * hd)
            x = residual + lin(att, p + "self_attn.o_proj.weight")
            m_in = rms(x, w[p + "post_attention_layernorm.weight"], eps)
            act = torch.nn.functional.silu(lin(m_in, p + "mlp.gate_proj.weight"))
            x = x + lin(act * lin(m_in, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
        normed = rms(x, w["norm.weight"], eps)
        out.append(lin(normed, "lm_head.weight"))
        # fed back: the last layer's output, pre-norm (post-norm when norm_output)
        h = normed if cfg["norm_output"] else x
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--inputs", required=True, type=Path)
    ap.add_argument("--side-out", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = json.loads((args.model / "config.json").read_text())
    w = {k: v.float() if v.dtype.is_floating_point else v
         for k, v in load_file(args.model / "model.safetensors").items()}
    inp = load_file(args.inputs)
    side = load_file(args.side_out)
    steps = sum(1 for k in side if k.startswith("logits_"))
    ref = reference(cfg, w, inp["hidden_states"][0].float(), inp["input_ids"][0].long(), steps)
    diffs = [float((ref[k] - side[f"logits_{k}"]).abs().max()) for k in range(steps)]
    same_tokens = all(torch.equal(ref[k].argmax(-1), side[f"tokens_{k}"]) for k in range(steps))
    ok = max(diffs) < 1e-4 and same_tokens
    print(json.dumps({"max_abs_diff_per_step": diffs, "same_tokens": same_tokens, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
