"""`specdec train early-exit`: fine-tune a target so that its own first layers draft for it (LayerSkip,
Elhoushi et al. 2024), for the `early_exit` strategy.

    specdec train early-exit train_early_exit target=PATH output_dir=PATH
    torchrun --nproc_per_node=2 -m specdec.heads.early_exit_train train_early_exit ...   (DDP, gloo or nccl)

The target itself is trained (all its weights, or only its decoder layers: `trainable`). Each step, on
a batch of corpus windows: layer dropout (layer l of L dropped for each row apart with a probability
rising from 0 at the first layer to layer_dropout_max at the last), and the cross-entropy of the next
token at the exits the curriculum picks for this step (heads/layerskip.py), each read through the
target's own final norm and lm_head as `early_exit` drafts, weighted and summed; the last layer's
loss is always in. Every random draw of a step is keyed by (seed, step, rank), so a resumed run makes
the weights an uninterrupted one makes (heads/loop.py).

Held-out evaluation (at the start, every eval_interval steps and at the end, without dropout): at every
exit E, the cross-entropy of the next token and how often E's argmax is the last layer's (the share of
greedy drafts that a chain would keep, token by token); the last layer's loss is the target's own
quality, which the fine-tune must keep. At the end the fine-tuned target is written to
<output_dir>/target: a plain Hugging Face checkpoint (config, safetensors, tokenizer) and
early_exit.json (the recipe, the target it was made from, the last evaluation), the folder put in
place whole (specdec.atomic.atomic_folder). Draft from it with
`specdec generate early_exit target.path=<output_dir>/target early_exit.exit_layer=E`.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from specdec.atomic import atomic_folder
from specdec.config import build_config, setting
from specdec.errors import ConfigError
from specdec.models import has_native_bf16
from specdec.strategies.early_exit import decoder_layers, num_layers

from .data import fixed_windows
from .distill import step_generator
from .help import keys_help
from .interrupt import training_main
from .layerskip import (CURRICULA, DROPOUT_SCALES, SCALE_TYPES, dropout_rates, exit_weights, exits_at, final_norm,
                        keep_mask, layer_hooks)
from .loop import Drafter, Run, Setup, train

CHECKPOINT_FILE = "early_exit_checkpoint.safetensors"
LOG_FILE = "train_early_exit.json"
TARGET_FOLDER = "target"               # in output_dir: the fine-tuned target
INFO_FILE = "early_exit.json"          # in that folder: how it was made
FORMAT = "specdec-early-exit-target"
RUN = Run("early_exit", "train early-exit", CHECKPOINT_FILE, None, LOG_FILE)
TRAINABLE = ("all", "layers")


@dataclass
class TrainEarlyExitConfig:
    target: Optional[str] = None        # Hugging Face checkpoint folder of the target to fine-tune
    tokenizer: Optional[str] = None     # the target's tokenizer folder when it is not beside its weights
    output_dir: str = "early-exit-out"  # the fine-tuned target (output_dir/target) + checkpoint + log; re-run to resume
    corpus: List[str] = field(default_factory=list)     # files / folders; [] = the whole standard library
    corpus_root: Optional[str] = None
    heldout: List[str] = field(default_factory=list)
    split_file: Optional[str] = None    # JSON with "train" / "heldout" file lists
    # the recipe
    trainable: str = setting("all", choices=TRAINABLE)   # all the target's weights | layers: its decoder layers only
    #   (the embeddings, final norm and lm_head stay as they are)
    early_exit_curriculum: str = setting("rotational", choices=CURRICULA)   # which exits get a loss on which step:
    #   rotational (every early_exit_rotation-th exit, moving one deeper each step), gradual (switched on from
    #   the deepest exit down, all by half the run), none (every exit, every step); the last layer's always
    early_exit_rotation: int = setting(2, min=1)        # rotational: R, each exit gets a loss every R steps
    early_exit_scale: float = setting(1.0, min=0.0)     # e_scale: weight of the early exits' losses against the last's
    early_exit_scale_type: str = setting("sum_l", choices=SCALE_TYPES)   # exit E weighs 1+...+E (sum_l), E (l) or 1 (one)
    layer_dropout_max: float = setting(0.1, min=0.0, max=1.0)   # p_max: the last layer's drop probability (per row)
    layer_dropout_scale: str = setting("exp", choices=DROPOUT_SCALES)   # from 0 at the first layer to p_max:
    #   exp (the paper's e^(l ln2 / (L-1)) - 1) or linear
    # optimisation
    seq_len: int = setting(256, min=2)
    batch_size: int = setting(4, min=1)                # global batch (split across torchrun ranks)
    steps: int = setting(300, min=1)
    max_minutes: Optional[float] = setting(None, above=0.0)   # also stop after this much training time (summed
    #   over resumes); the lr schedule then follows whichever of steps / time is further along
    lr: float = setting(1e-4, above=0.0)              # peak; a fine-tune: far below a pretraining lr
    min_lr_ratio: float = setting(0.1, min=0.0, max=1.0)
    warmup_steps: int = setting(20, min=0)
    weight_decay: float = setting(0.0, min=0.0)
    grad_clip: float = setting(1.0, min=0.0)
    bf16: Optional[bool] = None         # bf16 autocast for the training forwards (weights, optimizer and evaluation
    #   stay float32); null: where it pays (CUDA with bf16, a CPU with bf16 dot products)
    # bookkeeping
    seed: int = setting(0, min=0)
    eval_interval: int = setting(100, min=1)
    eval_windows: int = setting(16, min=1)             # held-out windows of seq_len tokens
    checkpoint_interval: int = setting(50, min=1)
    device: str = "cpu"
    dtype: str = setting("float32", choices=("float32",))   # the target trains in float32 (bf16: autocast)
    backend: Optional[str] = None       # torch.distributed backend under torchrun (None: nccl on CUDA, else gloo)
    progress: bool = True


def validate(cfg) -> None:
    if not cfg.target:
        raise ConfigError("no target given: set target=/path/to/a/huggingface/checkpoint (e.g. `specdec train "
                          "early-exit train_early_exit target=... output_dir=...`); the command, given none, "
                          "trains the default family's target")
    if cfg.layer_dropout_max >= 1:
        raise ConfigError(f"layer_dropout_max must be below 1 (at 1 the last layer never runs), got "
                          f"{cfg.layer_dropout_max}")


def load_train_early_exit_config(name_or_path: str | None = None, overrides=None):
    cfg = build_config(TrainEarlyExitConfig, name_or_path, overrides)
    validate(cfg)
    return cfg


# ---------------------------------------------------------------------- the exits of a forward
class Exits:
    """The target's pieces that every exit reads: its decoder layers, final norm and lm_head."""

    def __init__(self, target):
        path = decoder_layers(target)                   # refuses an architecture whose layers cannot be run apart
        self.count = num_layers(target)
        self.layers = target.get_submodule(path)
        self.norm = final_norm(target, path)
        self.head = target.get_output_embeddings()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[b, T, H] a layer's output -> [b, T, V]: through the final norm and the lm_head."""
        return self.head(self.norm(hidden))


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ids[:, 1:] under logits[:, :-1] ([b, T, V], [b, T])."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())


@torch.no_grad()
def heldout_metrics(target, exits: Exits, windows: torch.Tensor, batch_size: int) -> dict:
    """At every exit E (1 .. L) on the held-out windows [n, T]: loss[E] (mean next-token cross-entropy)
    and, below L, match[E] (how often E's argmax is the last layer's). The last layer's perplexity too."""
    was_training = target.training
    target.eval()
    losses = [0.0] * exits.count
    matches = [0.0] * (exits.count - 1)
    positions = 0
    for i in range(0, windows.shape[0], batch_size):
        ids = windows[i: i + batch_size].to(target.device)                           # [b, T]
        with layer_hooks(exits.layers, None, {}) as outputs:
            final = target(input_ids=ids).logits.float()                             # [b, T, V]
        last = final.argmax(-1)                                                      # [b, T]
        count = ids[:, 1:].numel()
        for e in range(1, exits.count + 1):
            logits = final if e == exits.count else exits.logits(outputs[e - 1]).float()
            losses[e - 1] += float(next_token_loss(logits, ids)) * count
            if e < exits.count:
                matches[e - 1] += float((logits.argmax(-1) == last)[:, :-1].sum())
        positions += count
    target.train(was_training)
    loss = [x / positions for x in losses]
    return {"loss": loss, "match": [x / positions for x in matches], "perplexity": math.exp(loss[-1])}


def describe(result: dict) -> str:
    return (f"held-out last-layer loss {result['loss'][-1]:.4f} (perplexity {result['perplexity']:.2f}) | "
            f"exit match 1..{len(result['match'])} " + " ".join(f"{m:.2f}" for m in result["match"]))


# ---------------------------------------------------------------------- saving
def save_target(folder: str, target, tokenizer, info: dict) -> None:
    """The fine-tuned target as a plain Hugging Face checkpoint (config, safetensors, tokenizer) with
    `info` as early_exit.json, put at `folder` whole: a reader finds it complete or not at all."""
    def build(tmp: str) -> None:
        target.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, INFO_FILE), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
    atomic_folder(folder, build)


# ---------------------------------------------------------------------- the target in the loop
def early_exit_drafter(setup: Setup) -> Drafter:
    """The target itself in the training loop (heads/loop.py): layer dropout and the early-exit losses
    on each step's windows; held-out loss and argmax match at every exit."""
    cfg, target, ddp = setup.cfg, setup.target, setup.ddp
    exits = Exits(target)
    if cfg.trainable == "all":
        target.requires_grad_(True)
    else:
        exits.layers.requires_grad_(True)
    rates = dropout_rates(exits.count, cfg.layer_dropout_max, cfg.layer_dropout_scale)
    heldout = fixed_windows(setup.heldout_stream, cfg.seq_len, cfg.eval_windows) if ddp.main else None
    student = ddp.wrap(target)
    bf16 = has_native_bf16(setup.device) if cfg.bf16 is None else bool(cfg.bf16)
    autocast = torch.autocast(setup.device.type, dtype=torch.bfloat16, enabled=bf16)

    def loss(windows: torch.Tensor, step: int):
        ids = windows.to(setup.device)                                               # [b, T]
        chosen = exits_at(step, exits.count, cfg.early_exit_curriculum, cfg.early_exit_rotation, cfg.steps)
        weights = exit_weights(chosen, exits.count, cfg.early_exit_scale_type, cfg.early_exit_scale)
        keep = keep_mask(rates, ids.shape[0], step_generator(cfg.seed, step, ddp.rank))   # [L, b]
        parts = {}
        with autocast, layer_hooks(exits.layers, keep, {}) as outputs:
            parts[exits.count] = next_token_loss(student(input_ids=ids).logits, ids)
            for e in chosen[:-1]:
                parts[e] = next_token_loss(exits.logits(outputs[e - 1]), ids)
        total = sum(weights[e] * parts[e] for e in chosen)
        return total, {"exits": chosen, "dropped": int((~keep).sum()),
                       "parts": {e: float(value.detach()) for e, value in parts.items()}}

    def evaluate(step: int, full: bool) -> dict:
        return heldout_metrics(target, exits, heldout, cfg.batch_size)

    def postfix(metrics: dict, last: dict | None) -> str:
        shown = f" | held-out last-layer loss {last['loss'][-1]:.3f}" if last else ""
        return f"loss {metrics['loss']:.4f}{shown}"

    def finish(steps: int, final: dict, elapsed: float) -> None:
        recipe = {key: OmegaConf.to_container(cfg)[key] for key in (
            "trainable", "early_exit_curriculum", "early_exit_rotation", "early_exit_scale", "early_exit_scale_type",
            "layer_dropout_max", "layer_dropout_scale", "seq_len", "batch_size", "lr", "seed")}
        info = {"format": FORMAT, "version": 1, "fine_tuned_from": setup.identity,
                "recipe": {**recipe, "steps": steps, "train_time_s": elapsed, "processes": ddp.world, "bf16": bf16},
                "heldout": {k: v for k, v in final.items() if k != "step"}}
        save_target(os.path.join(cfg.output_dir, TARGET_FOLDER), target, setup.tokenizer, info)

    trained = sum(p.numel() for p in target.parameters() if p.requires_grad)
    return Drafter(module=target, loss=loss, evaluate=evaluate, describe=describe, postfix=postfix, finish=finish,
                   layout={"trainable": cfg.trainable, "layers": exits.count},
                   extra={"trained_parameters": trained, "dropout_rates": rates, "bf16": bf16})


def train_early_exit(cfg, on_step: Callable[[int, dict], None] | None = None) -> str:
    """Fine-tune (or resume fine-tuning) a target as `cfg` (TrainEarlyExitConfig) says; returns output_dir."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainEarlyExitConfig), OmegaConf.structured(cfg))
    validate(cfg)
    return train(cfg, RUN, early_exit_drafter, on_step)


# ---------------------------------------------------------------------- command line
def help_text(name: str | None) -> str:
    return (f"usage: specdec train early-exit [CONFIG] [key=value ...]\nfine-tunes a target for early_exit; keys"
            f"{' (defaults)' if name is None else ', with this config' + chr(39) + 's values'}:\n"
            f"{keys_help(TrainEarlyExitConfig, name)}")


def main(argv: list[str] | None = None, cli: str = "specdec train early-exit") -> int:
    """specdec train early-exit [CONFIG_NAME_OR_YAML] [key=value ...]"""
    return training_main(argv, show_help=lambda name: print(help_text(name)),
                         load_config=load_train_early_exit_config, train=train_early_exit, cli=cli,
                         module="specdec.heads.early_exit_train",
                         saved=f"fine-tuned target saved in {{folder}}{os.sep}{TARGET_FOLDER} (draft from it: "
                               f"specdec generate early_exit target.path={{folder}}{os.sep}{TARGET_FOLDER})")


if __name__ == "__main__":
    sys.exit(main())
