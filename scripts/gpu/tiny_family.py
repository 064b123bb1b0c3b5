"""The dry run's stand-in for the pycode family: a tiny random Llama target and draft with a
character-level tokenizer, saved as Hugging Face folders (target/, draft/) under OUT_DIR, so every
step of scripts/gpu/check.sh runs on a CPU in about a minute. Its outputs mean nothing; its shapes,
files and code paths are the real ones.

    python scripts/gpu/tiny_family.py OUT_DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    import torch
    import transformers as T
    from specdec.family.tokenizer import char_tokenizer
    tokenizer = char_tokenizer()
    for name, (layers, hidden, seed) in {"target": (4, 64, 0), "draft": (1, 32, 1)}.items():
        torch.manual_seed(seed)
        config = T.LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = T.AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(args.out_dir / name)
        tokenizer.save_pretrained(args.out_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
