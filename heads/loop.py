"""The one training loop of every drafter: data -> step -> evaluation -> checkpoint -> resume ->
interrupt -> DDP -> progress. A drafter brings what is its own (a Drafter: its module, its loss on a
batch of windows, its held-out evaluation, its output files); everything else is here, once. The
default family's target is pretrained through it too, as a plug-in of the same kind (family/lm.py).

    train(cfg, Run("medusa", "train-heads", files), build, on_step)

Set-up: the target (frozen, cfg.dtype) and its tokenizer, the corpus's token streams, then
build(Setup) -> Drafter. Each step: lr_at -> this rank's share of cfg.batch_size windows drawn by
the window generator (seeded with cfg.seed: the same global batches on every rank) -> the drafter's
loss -> backward, gradient clipping -> the update, its step count and its loss, whole or not at all
(a Ctrl-C waits for them). Evaluation on rank 0 at the start, every eval_interval steps and at the
end, each written to the log (history). A checkpoint (heads/checkpoint.py: safetensors and JSON)
every checkpoint_interval steps, at the end and on Ctrl-C; a run whose output_dir holds one
resumes from it, bit for bit. Training time (evaluations left out) carries over a resume; a
config with max_minutes also stops on it, and its lr schedule follows whichever of steps / time is
further along. Under torchrun each rank trains on its share of every global batch (the drafter
wraps its trained forward in Distributed.wrap: DistributedDataParallel averages the gradients).
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from omegaconf import OmegaConf
from torch import nn
from tqdm.auto import tqdm

from specdec.atomic import atomic_write_json
from specdec.errors import ConfigError
from specdec.models import DTYPES, load_model, load_tokenizer, resolve_device

from .checkpoint import checkpoint_target, find_checkpoint, load_checkpoint, save_checkpoint
from .data import sample_windows, training_streams
from .interrupt import deferred_interrupt, stop_training


# ---------------------------------------------------------------------- schedule, log
def lr_at(step: int, cfg, elapsed_s: float = 0.0) -> float:
    """Linear warmup over cfg.warmup_steps to cfg.lr, then cosine down to lr * min_lr_ratio over the
    rest of the run: by steps, or by time when cfg has a max_minutes budget that is further along."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    budget = getattr(cfg, "max_minutes", None)
    if budget:
        progress = max(progress, elapsed_s / (60 * budget))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def out_of_time(elapsed_s: float, cfg) -> bool:
    budget = getattr(cfg, "max_minutes", None)
    return bool(budget) and elapsed_s >= 60 * budget


def write_log(path: str, cfg, history: list, losses: list, extra: dict) -> None:
    """The training log (atomically): the config, the evaluations, every step's loss and `extra`."""
    config = OmegaConf.to_container(cfg) if OmegaConf.is_config(cfg) else \
        OmegaConf.to_container(OmegaConf.structured(cfg))
    atomic_write_json(path, {"config": config, "history": history, "losses": losses, **extra}, indent=2)


def fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


# ---------------------------------------------------------------------- processes
class Distributed:
    """torchrun's environment (WORLD_SIZE, RANK), or a single process."""

    def __init__(self, cfg, device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1:
            import torch.distributed as dist
            if not dist.is_initialized():
                backend = getattr(cfg, "backend", None) or ("nccl" if device.type == "cuda" else "gloo")
                dist.init_process_group(backend=backend)
            self.dist = dist
        if cfg.batch_size % self.world:
            raise ConfigError(f"batch_size={cfg.batch_size} must be a multiple of the number of processes "
                              f"({self.world}): each rank trains on an equal share of every batch")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's windows of the global batch."""
        per = batch.shape[0] // self.world
        return batch[self.rank * per: (self.rank + 1) * per]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            value = value.detach().clone()
            self.dist.all_reduce(value)
            value /= self.world
        return value

    def max(self, value: float) -> float:
        """The largest value over the ranks (so that all agree, e.g. on a time budget)."""
        if self.world > 1:
            tensor = torch.tensor([value], dtype=torch.float64)
            self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
            value = float(tensor.item())
        return value

    def barrier(self) -> None:
        if self.world > 1:
            self.dist.barrier()

    def wrap(self, module: nn.Module) -> nn.Module:
        if self.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(module)


# ---------------------------------------------------------------------- what a drafter plugs in
@dataclass(frozen=True)
class Run:
    """A trainer's names: its checkpoint kind (heads/checkpoint.py), progress-bar label and files."""
    kind: str                       # medusa | eagle | draft | early_exit | pretrain
    label: str                      # the progress bar's
    checkpoint: str                 # file name in output_dir
    legacy_checkpoint: str | None   # where a pickled checkpoint was kept before: refused, never read (None: never)
    log: str                        # the training log's file name in output_dir


@dataclass
class Setup:
    """What the loop has made before the drafter: handed to its build()."""
    cfg: object
    device: torch.device
    ddp: Distributed
    target: nn.Module               # frozen (the early-exit trainer unfreezes it: it trains the target itself)
    tokenizer: object
    identity: dict                  # checkpoint_target(target): checked on resume
    train_files: list
    heldout_files: list
    train_stream: torch.Tensor      # [T_train]
    heldout_stream: torch.Tensor    # [T_heldout]


@dataclass
class Drafter:
    """What one drafter brings to the loop."""
    module: nn.Module               # trained (its parameters that require grad) and checkpointed
    loss: Callable                  # (windows [b, T] of this rank, step) -> (loss, metrics shown / given on_step)
    evaluate: Callable              # (step, full) -> held-out metrics; rank 0 only (full: at the start and the end)
    describe: Callable              # an evaluation -> one line
    postfix: Callable               # (a step's metrics, the last evaluation or None) -> the progress bar's text
    finish: Callable                # (steps, final evaluation, training time in s) -> write the output; rank 0 only
    layout: dict | None = None      # checked on resume
    extra: dict = field(default_factory=dict)   # also in the log
    param_groups: list | None = None    # AdamW parameter groups with options of their own (weight_decay, betas);
    #   None: one group of the module's trainable parameters, with cfg.weight_decay
    windows: Callable | None = None     # (stream [T], seq_len, batch_size, generator) -> the step's windows [b, seq_len];
    #   None: sample_windows (uniform starts over the whole stream)


# ---------------------------------------------------------------------- the loop
def train(cfg, run: Run, build: Callable[[Setup], Drafter], on_step: Callable[[int, dict], None] | None = None) -> str:
    """Train (or resume) as `cfg` says (a checked config); returns cfg.output_dir."""
    checkpoint = os.path.join(cfg.output_dir, run.checkpoint)
    log_file = os.path.join(cfg.output_dir, run.log)
    legacy = os.path.join(cfg.output_dir, run.legacy_checkpoint) if run.legacy_checkpoint else None
    resuming = find_checkpoint(checkpoint, legacy)          # before the set-up
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    ddp = Distributed(cfg, device)
    target = load_model(cfg.target, "target", device, DTYPES.get(cfg.dtype, torch.float32), key="target")
    target.requires_grad_(False)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.target, "target", key="tokenizer")
    train_files, heldout_files, train_stream, heldout_stream = training_streams(cfg, tokenizer, ddp.main)
    identity = checkpoint_target(target, cfg.target)
    drafter = build(Setup(cfg, device, ddp, target, tokenizer, identity, train_files, heldout_files,
                          train_stream, heldout_stream))
    params = [p for p in drafter.module.parameters() if p.requires_grad]
    draw = drafter.windows or sample_windows
    optimizer = torch.optim.AdamW(drafter.param_groups or params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)                # the same global batches on every rank
    os.makedirs(cfg.output_dir, exist_ok=True)
    step, history, losses, elapsed = 0, [], [], 0.0
    if resuming:
        saved = load_checkpoint(checkpoint, run.kind, drafter.module, optimizer, generator, identity, drafter.layout)
        step, history = int(saved["step"]), list(saved["history"])
        losses, elapsed = list(saved.get("losses", [])), float(saved.get("elapsed_s", 0.0))
    extra = {"train_files": len(train_files), "heldout_files": len(heldout_files),
             "train_tokens": int(train_stream.numel()), "heldout_tokens": int(heldout_stream.numel()),
             "processes": ddp.world, **drafter.extra}
    bar = tqdm(total=cfg.steps, initial=min(step, cfg.steps), desc=run.label,
               disable=not (cfg.progress and ddp.main), dynamic_ncols=True, file=sys.stderr)

    def save(at_elapsed: float) -> None:
        if ddp.main:                            # no collective here: on Ctrl-C the other ranks are stopping too
            save_checkpoint(checkpoint, run.kind, drafter.module, optimizer, generator, identity, drafter.layout,
                            step=step, history=history, losses=losses, elapsed_s=at_elapsed)

    def evaluate(at_step: int, full: bool) -> dict | None:
        if ddp.main:
            result = {"step": at_step, "train_time_s": elapsed, **drafter.evaluate(at_step, full)}
            if not history or history[-1]["step"] != at_step:
                history.append(result)
            write_log(log_file, cfg, history, losses, extra)
            bar.write(f"eval @ {at_step} ({elapsed / 60:.1f} min): {drafter.describe(result)}")
        ddp.barrier()
        return history[-1] if ddp.main else None

    if step == 0:
        evaluate(0, full=True)
    drafter.module.train()
    started = time.perf_counter() - elapsed                 # training time carries over a resume
    step_began, rng_before = step, generator.get_state()
    try:
        while step < cfg.steps and not out_of_time(elapsed, cfg):
            step_began, rng_before = step, generator.get_state()
            lr = lr_at(step, cfg, elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            windows = ddp.share(draw(train_stream, cfg.seq_len, cfg.batch_size, generator))   # [b, T]
            loss, shown = drafter.loss(windows, step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            metrics = {"loss": ddp.mean(loss).item(), **shown, "lr": lr}
            with deferred_interrupt():          # the update, its step count and its loss, whole or not at all
                optimizer.step()
                step += 1
                losses.append(metrics["loss"])
            elapsed = ddp.max(time.perf_counter() - started) if getattr(cfg, "max_minutes", None) \
                else time.perf_counter() - started
            bar.update(1)
            bar.set_postfix_str(drafter.postfix(metrics, history[-1] if ddp.main and history else None))
            last = step == cfg.steps or out_of_time(elapsed, cfg)
            if step % cfg.checkpoint_interval == 0 or last:
                save(elapsed)
            if step % cfg.eval_interval == 0 and not last:
                began = time.perf_counter()
                evaluate(step, full=False)
                started += time.perf_counter() - began      # training time leaves out the evaluations
            if on_step is not None:
                on_step(step, metrics)
    except KeyboardInterrupt:
        stop_training(bar, step, step_began, generator, rng_before, lambda: save(time.perf_counter() - started),
                      cfg.steps, checkpoint)
    bar.close()
    cut_short = step < cfg.steps and out_of_time(elapsed, cfg)
    if cut_short and ddp.main:
        bar.write(f"stopped by max_minutes={cfg.max_minutes} after {step} of {cfg.steps} steps: another machine "
                  f"would train another number of steps (max_minutes=null trains them all, the same everywhere)")
    final = evaluate(step, full=True)
    if ddp.main:
        extra["train_time_s"] = elapsed
        extra["steps_done"] = step
        extra["stopped_by_max_minutes"] = cut_short
        drafter.finish(step, final, elapsed)
        write_log(log_file, cfg, history, losses, extra)
    ddp.barrier()
    return cfg.output_dir
