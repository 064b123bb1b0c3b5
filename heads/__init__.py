"""Medusa-style heads: the module, the safetensors + JSON file format, and the training script
(`specdec train-heads`, `specdec.heads.train.train_heads(cfg)`)."""
from .io import check_heads_fit_target, load_heads, save_heads, target_fingerprint
from .module import HeadsLayout, MedusaHeads

__all__ = ["HeadsLayout", "MedusaHeads", "load_heads", "save_heads", "target_fingerprint",
           "check_heads_fit_target", "train_heads"]


def train_heads(cfg, on_step=None) -> str:
    """Train heads as the TrainHeadsConfig `cfg` says; returns the output folder."""
    from .train import train_heads as _train
    return _train(cfg, on_step)
