"""`specdec train-heads`: train Medusa-style heads for a frozen target by self-distillation.

Each batch: corpus windows -> one no-grad target forward (last hidden states [B, T, H] and logits
[B, T, V]) -> the heads on the first T - K positions (token-conditioned head k also reads the
token at t + k); head k at position t learns the target's own distribution at position t + k
(the one that predicts token t + k + 1), by soft cross-entropy, weighted decay ** (k - 1).
Held-out evaluation reports per-head top-1 / top-5 agreement with the target's greedy token. Checkpoints
(heads, optimizer, step, RNG: safetensors and JSON, heads/checkpoint.py) are written atomically;
re-running with the same output_dir resumes from the last one.

    specdec train-heads train_heads target=/path/to/model output_dir=/path/to/heads steps=600
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import time
from typing import Callable

import torch
from omegaconf import OmegaConf
from torch.nn import functional as F
from tqdm.auto import tqdm

from specdec.atomic import atomic_write_json
from specdec.config import parse_overrides
from specdec.errors import ConfigError
from specdec.models import DTYPES, load_model, load_tokenizer, resolve_device

from .checkpoint import checkpoint_target, find_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainHeadsConfig, load_train_config, validate
from .data import fixed_windows, resolve_files, sample_windows, split_heldout, token_streams
from .help import help_text
from .interrupt import deferred_interrupt, stop_training, training_main
from .io import output_vocab, save_heads
from .module import HeadsLayout, MedusaHeads

CHECKPOINT_FILE = "checkpoint.safetensors"
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"          # a pickle, written before; refused, never read
LOG_FILE = "train.json"
log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- losses and metrics
@torch.no_grad()
def target_outputs(target, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] ids -> (last hidden states [B, T, H], logits [B, T, V]), fp32, no grad."""
    out = target(input_ids=input_ids.to(target.device), output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1].float(), out.logits.float()


def run_heads(heads: MedusaHeads, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The heads on the first T - K positions: hidden [B, T, H], input_ids [B, T] -> [B, T - K, K, V].
    Token-conditioned head k at position t reads token t + k (the one before the token it guesses)."""
    num_heads, positions = heads.num_heads, hidden.shape[1] - heads.num_heads
    prev_ids = None
    if heads.layout.token_conditioned:
        ids = input_ids.to(hidden.device)
        prev_ids = torch.stack([ids[:, k: k + positions] for k in range(1, num_heads + 1)], dim=-1)   # [B, T-K, K]
    return heads(hidden[:, :positions], prev_ids)


def head_losses(head_logits: torch.Tensor, teacher_logits: torch.Tensor, with_top5: bool = True):
    """Per-head soft cross-entropy against the target's distribution at the shifted position.

    head_logits [B, P, K, V] (P <= T): head k (index k - 1) at t guesses token t + k + 1;
    teacher_logits [B, T, V]: the target at t guesses token t + 1.
    Returns (loss [K], top-1 agreement [K], top-5 agreement [K] or None) with the target's argmax."""
    num_heads, seq_len = head_logits.shape[2], teacher_logits.shape[1]
    teacher_probs = teacher_logits.softmax(dim=-1)                          # [B, T, V]
    teacher_best = teacher_logits.argmax(dim=-1)                            # [B, T]
    losses, top1, top5 = [], [], []
    for k in range(1, num_heads + 1):
        n = min(head_logits.shape[1], seq_len - k)                             # positions scored
        student = head_logits[:, :n, k - 1].float().flatten(0, 1)              # [B*n, V]
        wanted = teacher_best[:, k: k + n].flatten()                           # [B*n]
        losses.append(F.cross_entropy(student, teacher_probs[:, k: k + n].flatten(0, 1)))
        with torch.no_grad():
            top1.append((student.argmax(dim=-1) == wanted).float().mean())
            if with_top5:
                best5 = student.topk(min(5, student.shape[-1]), dim=-1).indices    # [B*(T-k), 5]
                top5.append((best5 == wanted[:, None]).any(dim=-1).float().mean())
    return torch.stack(losses), torch.stack(top1), (torch.stack(top5) if with_top5 else None)


def loss_weights(num_heads: int, decay: float, device) -> torch.Tensor:
    return torch.tensor([decay ** k for k in range(num_heads)], device=device)   # [K]


def lr_at(step: int, cfg: TrainHeadsConfig) -> float:
    """Linear warmup, then cosine from lr down to lr * min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class HeldOut:
    """Fixed held-out windows with the target's outputs computed once."""

    def __init__(self, target, windows: torch.Tensor, batch_size: int):
        self.batches = [(windows[i: i + batch_size], *target_outputs(target, windows[i: i + batch_size]))
                        for i in range(0, windows.shape[0], batch_size)]
        self.num_windows = windows.shape[0]

    @torch.no_grad()
    def evaluate(self, heads: MedusaHeads, weights: torch.Tensor) -> dict:
        totals = None
        for input_ids, hidden, teacher_logits in self.batches:
            losses, top1, top5 = head_losses(run_heads(heads, hidden, input_ids), teacher_logits)
            parts = torch.stack([losses, top1, top5]) * hidden.shape[0]      # [3, K]
            totals = parts if totals is None else totals + parts
        losses, top1, top5 = (totals / self.num_windows).tolist()
        return {"loss": float(sum(w * l for w, l in zip(weights.tolist(), losses))),
                "head_loss": losses, "top1": top1, "top5": top5}


# ---------------------------------------------------------------------- set-up
def corpus_files(cfg: TrainHeadsConfig) -> tuple[list[str], list[str]]:
    corpus, heldout = list(cfg.corpus), list(cfg.heldout)
    if cfg.split_file:
        try:
            with open(cfg.split_file) as f:
                split = json.load(f)
            corpus, heldout = list(split["train"]), list(split["heldout"])
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"split_file={cfg.split_file!r} could not be read as JSON with 'train' and "
                              f"'heldout' file lists: {exc}") from exc
    files = resolve_files(corpus, cfg.corpus_root)
    if heldout:
        return files, resolve_files(heldout, cfg.corpus_root)
    return split_heldout(files)


def training_streams(cfg, tokenizer, announce: bool = True):
    """(train files, held-out files, train [T_train], held-out [T_heldout]) of the config's corpus:
    the files and their token streams, documents joined by the tokenizer's EOS. A note on how the
    held-out part was chosen is logged as a warning when `announce` (rank 0 of several); a stream
    shorter than one window is a ConfigError."""
    train_files, heldout_files = corpus_files(cfg)
    train_stream, heldout_stream, note = token_streams(train_files, heldout_files, tokenizer, tokenizer.eos_token_id,
                                                       min_tokens=cfg.seq_len + 1)
    if note and announce:
        log.warning(note)
    for name, stream in (("training", train_stream), ("held-out", heldout_stream)):
        if stream.numel() < cfg.seq_len + 1:
            raise ConfigError(f"the {name} text has {stream.numel()} tokens, fewer than seq_len={cfg.seq_len}: "
                              f"give a larger corpus or a smaller seq_len")
    return train_files, heldout_files, train_stream, heldout_stream


def build_heads(cfg: TrainHeadsConfig, target) -> MedusaHeads:
    """Fresh heads in fp32 on the target's device, with fp32 frozen copies of its lm_head and
    input embedding."""
    lm_head = target.get_output_embeddings()
    layout = HeadsLayout(cfg.num_heads, cfg.num_layers, int(target.config.hidden_size), output_vocab(target),
                         cfg.own_lm_head, cfg.token_conditioned)
    heads = MedusaHeads(layout).to(target.device)
    heads.init_own_lm_heads(lm_head.weight.float())
    heads.attach_lm_head(copy.deepcopy(lm_head).float().requires_grad_(False))
    heads.attach_embedding(copy.deepcopy(target.get_input_embeddings()).float().requires_grad_(False))
    return heads


def _rng_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _write_log(folder: str, cfg, history: list, extra: dict) -> None:
    data = {"config": OmegaConf.to_container(OmegaConf.structured(cfg)) if not isinstance(cfg, dict) else cfg,
            "history": history, **extra}
    atomic_write_json(os.path.join(folder, LOG_FILE), data, indent=2)


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


# ---------------------------------------------------------------------- the loop
def train_heads(cfg: TrainHeadsConfig, on_step: Callable[[int, dict], None] | None = None) -> str:
    """Train (or resume) heads as `cfg` says; returns the output folder (heads.json +
    heads.safetensors + checkpoint.safetensors + train.json). `on_step(step, metrics)` runs after each step."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainHeadsConfig), OmegaConf.structured(cfg))
    validate(cfg)
    checkpoint = os.path.join(cfg.output_dir, CHECKPOINT_FILE)
    resuming = find_checkpoint(checkpoint, os.path.join(cfg.output_dir, LEGACY_CHECKPOINT_FILE))   # before the set-up
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    target = load_model(cfg.target, "target", device, DTYPES.get(cfg.dtype, torch.float32), key="target")
    target.requires_grad_(False)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.target, "target", key="tokenizer")

    train_files, heldout_files, train_stream, heldout_stream = training_streams(cfg, tokenizer)   # [T_train], [T_heldout]
    heldout = HeldOut(target, fixed_windows(heldout_stream, cfg.seq_len, cfg.eval_windows), cfg.batch_size)

    heads = build_heads(cfg, target)
    params = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = _rng_generator(cfg.seed)
    weights = loss_weights(cfg.num_heads, cfg.head_loss_decay, device)              # [K]
    identity = checkpoint_target(target, cfg.target)
    os.makedirs(cfg.output_dir, exist_ok=True)
    step, history = 0, []
    if resuming:
        saved = load_checkpoint(checkpoint, "medusa", heads, optimizer, generator, identity, heads.layout.as_dict())
        step, history = int(saved["step"]), list(saved["history"])

    def save() -> None:
        save_checkpoint(checkpoint, "medusa", heads, optimizer, generator, identity, heads.layout.as_dict(),
                        step=step, history=history)
    extra = {"train_files": len(train_files), "heldout_files": len(heldout_files),
             "train_tokens": int(train_stream.numel()), "heldout_tokens": int(heldout_stream.numel())}

    def evaluate(at_step: int) -> dict:
        heads.eval()
        result = {"step": at_step, **heldout.evaluate(heads, weights)}
        heads.train()
        if not history or history[-1]["step"] != at_step:
            history.append(result)
        _write_log(cfg.output_dir, cfg, history, extra)
        bar.write(f"eval @ {at_step}: loss {result['loss']:.3f} | top-1 per head {_fmt(result['top1'])} "
                  f"| top-5 {_fmt(result['top5'])}")
        return result

    bar = tqdm(total=cfg.steps, initial=min(step, cfg.steps), desc="train-heads", disable=not cfg.progress,
               dynamic_ncols=True, file=sys.stderr)
    if step == 0:
        evaluate(0)
    heads.train()
    started = time.perf_counter()
    step_began, rng_before = step, generator.get_state()
    try:
        while step < cfg.steps:
            step_began, rng_before = step, generator.get_state()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            batch = sample_windows(train_stream, cfg.seq_len, cfg.batch_size, generator)  # [B, T]
            hidden, teacher_logits = target_outputs(target, batch)                         # [B,T,H], [B,T,V]
            losses, top1, _ = head_losses(run_heads(heads, hidden, batch), teacher_logits, with_top5=False)  # [K]
            loss = (weights * losses).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            with deferred_interrupt():          # the update and its step count, whole or not at all
                optimizer.step()
                step += 1
            metrics = {"loss": loss.item(), "top1": top1.tolist(), "lr": lr_at(step - 1, cfg)}
            bar.update(1)
            bar.set_postfix_str(f"loss {metrics['loss']:.3f} top1 {_fmt(metrics['top1'])}")
            if step % cfg.checkpoint_interval == 0 or step == cfg.steps:
                save()
            if step % cfg.eval_interval == 0 and step != cfg.steps:
                evaluate(step)
            if on_step is not None:
                on_step(step, metrics)
    except KeyboardInterrupt:
        stop_training(bar, step, step_began, generator, rng_before, save, cfg.steps, checkpoint)
    bar.close()
    final = evaluate(step)
    extra["train_time_s"] = extra.get("train_time_s", 0) + (time.perf_counter() - started)
    save_heads(cfg.output_dir, heads, target, training={
        "steps": step, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "head_loss_decay": cfg.head_loss_decay,
        "heldout": {k: final[k] for k in ("loss", "top1", "top5")}})
    _write_log(cfg.output_dir, cfg, history, extra)
    return cfg.output_dir


def main(argv: list[str] | None = None) -> int:
    """specdec train-heads [CONFIG_NAME_OR_YAML] [key=value ...]"""
    return training_main(argv, show_help=lambda name: print(help_text(name)),
                         load_config=lambda name, argv: load_train_config(name, parse_overrides(argv)),
                         train=train_heads, cli="specdec train-heads", module="specdec.heads.train",
                         saved="heads saved in {folder}")

if __name__ == "__main__":
    sys.exit(main())
