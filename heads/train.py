"""`specdec train-heads`: train Medusa-style heads for a frozen target by self-distillation.

Each batch: corpus windows -> one no-grad target forward (last hidden states [B, T, H] and logits
[B, T, V]) -> the heads on the first T - K positions (token-conditioned head k also reads the
token at t + k); head k at position t learns the target's own distribution at position t + k
(the one that predicts token t + k + 1), by soft cross-entropy, weighted decay ** (k - 1).
Held-out evaluation reports per-head top-1 / top-5 agreement with the target's greedy token. The
loop itself (checkpoints, resume, Ctrl-C, DDP, progress) is heads/loop.py's, shared by every drafter.

    specdec train medusa train_heads target=/path/to/model output_dir=/path/to/heads steps=600
    torchrun --nproc_per_node=2 -m specdec.heads.train train_heads target=... (DDP)
"""
from __future__ import annotations

import copy
import sys
from typing import Callable

import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

from specdec.config import parse_overrides

from .config import TrainHeadsConfig, load_train_config, validate
from .data import fixed_windows, training_streams  # noqa: F401 - training_streams: the scripts' name too
from .help import help_text
from .interrupt import training_main
from .loop import Drafter, Run, Setup, fmt, train
from .io import output_vocab, save_heads
from .module import HeadsLayout, MedusaHeads

CHECKPOINT_FILE = "checkpoint.safetensors"
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"          # a pickle, written before; refused, never read
LOG_FILE = "train.json"
RUN = Run("medusa", "train-heads", CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, LOG_FILE)


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


# ---------------------------------------------------------------------- the drafter in the loop
class _OnWindows(torch.nn.Module):
    """The heads' trained forward as one module call (what DistributedDataParallel wraps)."""

    def __init__(self, heads: MedusaHeads):
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return run_heads(self.heads, hidden, input_ids)


def medusa_drafter(setup: Setup) -> Drafter:
    """Medusa heads in the training loop (heads/loop.py): their loss on a batch, held-out agreement."""
    cfg, target, ddp = setup.cfg, setup.target, setup.ddp
    heldout = None
    if ddp.main:
        heldout = HeldOut(target, fixed_windows(setup.heldout_stream, cfg.seq_len, cfg.eval_windows), cfg.batch_size)
    heads = build_heads(cfg, target)
    forward = ddp.wrap(_OnWindows(heads))
    weights = loss_weights(cfg.num_heads, cfg.head_loss_decay, setup.device)              # [K]

    def loss(windows: torch.Tensor, step: int):
        hidden, teacher_logits = target_outputs(target, windows)                           # [b,T,H], [b,T,V]
        losses, top1, _ = head_losses(forward(hidden, windows), teacher_logits, with_top5=False)  # [K]
        return (weights * losses).sum(), {"top1": ddp.mean(top1).tolist()}

    def evaluate(step: int, full: bool) -> dict:
        heads.eval()
        result = heldout.evaluate(heads, weights)
        heads.train()
        return result

    def finish(steps: int, final: dict, elapsed: float) -> None:
        save_heads(cfg.output_dir, heads, target, training={
            "steps": steps, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
            "head_loss_decay": cfg.head_loss_decay, "heldout": {k: final[k] for k in ("loss", "top1", "top5")}})

    return Drafter(module=heads, loss=loss, evaluate=evaluate, finish=finish, layout=heads.layout.as_dict(),
                   describe=lambda r: f"loss {r['loss']:.3f} | top-1 per head {fmt(r['top1'])} | top-5 {fmt(r['top5'])}",
                   postfix=lambda m, last: f"loss {m['loss']:.3f} top1 {fmt(m['top1'])}")


def train_heads(cfg: TrainHeadsConfig, on_step: Callable[[int, dict], None] | None = None) -> str:
    """Train (or resume) heads as `cfg` says; returns the output folder (heads.json +
    heads.safetensors + checkpoint.safetensors + train.json). `on_step(step, metrics)` runs after each step."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainHeadsConfig), OmegaConf.structured(cfg))
    validate(cfg)
    return train(cfg, RUN, medusa_drafter, on_step)


def main(argv: list[str] | None = None, cli: str = "specdec train-heads") -> int:
    """specdec train-heads [CONFIG_NAME_OR_YAML] [key=value ...]"""
    return training_main(argv, show_help=lambda name: print(help_text(name)),
                         load_config=lambda name, argv: load_train_config(name, parse_overrides(argv)),
                         train=train_heads, cli=cli, module="specdec.heads.train",
                         saved="heads saved in {folder}")

if __name__ == "__main__":
    sys.exit(main())
