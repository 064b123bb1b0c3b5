"""The embedded default model family, built by specdec's own code from the Python standard
library's source: a byte-level BPE tokenizer, a small Llama target (pretrained in the trainers'
one loop, heads/loop.py), a much smaller Llama draft distilled into it (by `specdec train-draft`'s
code), Medusa heads and an EAGLE drafter for the target (by `specdec train-heads`' code). Cached
per config; see store.py for the on-disk layout."""
from .config import FamilyConfig, config_hash, load_family_config
from .build import FamilyPaths, ensure_family, family_is_built, family_paths

__all__ = ["FamilyConfig", "FamilyPaths", "config_hash", "ensure_family", "family_is_built",
           "family_paths", "load_family_config"]
