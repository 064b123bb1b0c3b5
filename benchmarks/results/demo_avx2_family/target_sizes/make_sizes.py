"""Random-weight targets of the default family's config resized (same vocabulary and tokenizer), for `specdec profile`.

    python make_sizes.py FAMILY_TARGET_DIR OUT_DIR     # FAMILY_TARGET_DIR: SPECDEC_HOME/default-<hash>/target
"""
import json, sys, torch, shutil
src, dst = sys.argv[1], sys.argv[2]
from transformers import LlamaConfig, LlamaForCausalLM
base = json.load(open(f"{src}/config.json"))
only = set(sys.argv[3:])     # names to make (default: all)
for name, (h, L, inter, heads) in {"h128L8": (128, 8, 344, 4), "h256L4": (256, 4, 688, 4), "h256L6": (256, 6, 688, 4),
                                  "h384L4": (384, 4, 1024, 6), "h512L3": (512, 3, 1376, 8),
                                  "h96L12": (96, 12, 256, 3), "h64L16": (64, 16, 172, 2)}.items():
    if only and name not in only:
        continue
    cfg = dict(base); cfg.update(hidden_size=h, num_hidden_layers=L, intermediate_size=inter, num_attention_heads=heads,
                                 num_key_value_heads=heads, head_dim=h // heads)
    for k in ("architectures", "transformers_version", "dtype"): cfg.pop(k, None)
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**cfg))
    out = f"{dst}/{name}"
    m.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        try: shutil.copy(f"{src}/{f}", out)
        except FileNotFoundError: pass
    print(name, sum(p.numel() for p in m.parameters()) / 1e6, "M")
