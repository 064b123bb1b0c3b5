"""Trained drafters that live on the target: Medusa-style heads and the EAGLE-style feature
drafter - their modules, the safetensors + JSON file formats and the training scripts
(`specdec train-heads`, `specdec.heads.train.train_heads(cfg)`; `specdec train-heads train_eagle`,
`specdec.heads.eagle_train.train_eagle(cfg)`)."""
from .eagle import EagleDrafter, EagleLayout
from .eagle_io import load_eagle, save_eagle
from .io import check_heads_fit_target, load_heads, save_heads, target_fingerprint
from .module import HeadsLayout, MedusaHeads

__all__ = ["HeadsLayout", "MedusaHeads", "load_heads", "save_heads", "target_fingerprint",
           "check_heads_fit_target", "train_heads", "EagleDrafter", "EagleLayout", "load_eagle",
           "save_eagle", "train_eagle"]


def train_heads(cfg, on_step=None) -> str:
    """Train heads as the TrainHeadsConfig `cfg` says; returns the output folder."""
    from .train import train_heads as _train
    return _train(cfg, on_step)


def train_eagle(cfg, on_step=None) -> str:
    """Train an EAGLE drafter as the TrainEagleConfig `cfg` says; returns the output folder."""
    from .eagle_train import train_eagle as _train
    return _train(cfg, on_step)
