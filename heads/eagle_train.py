"""Train an EAGLE drafter for a frozen target by self-distillation (training-time test).

    specdec train eagle train_eagle target=/path/to/model output_dir=/path/to/drafter
    torchrun --nproc_per_node=2 -m specdec.heads.eagle_train train_eagle target=... (DDP)

Each batch: corpus windows -> one no-grad target forward (features of `feature_layers` [B, T, F]
and logits [B, T, V]) -> the drafter unrolled `ttt_steps` times on its own predictions, as it
runs at inference. Step 1, row s reads (target feature f_s, token x_{s+1}); step j > 1, row s
reads the drafter's own step j - 1 output of row s - 1 (its guess of f_s) and x_{s+1}, and
attends to the step-1 rows up to s - j + 1 and to its own chain (the step-i rows s - j + i):
exactly what a depth-(j - 1) tree node sees. Every step's row s learns the target's distribution
of token s + 2 (soft cross-entropy, weight decay ** (j - 1)); the EAGLE-1 layout also regresses
its output onto f_{s+1} (smooth L1, feature_loss_weight).

layout=mtp (`specdec train mtp`) trains one multi-token-prediction module in DeepSeek-V3's layout for a
target that ships none (heads/mtp.py: enorm, hnorm, eh_proj, one decoder layer of the target's own class and
shape, a post norm; the target's embedding and head shared), fed the target's last hidden state as EAGLE-1
is, on the cross-entropy alone: EAGLE without its feature loss. It is saved as the `mtp` strategy reads it
(mtp.path=output_dir: mtp.json + mtp.safetensors under the checkpoint's tensor names).

Held-out evaluation is the acceptance at inference: held-out windows whose tail is replaced by
the target's own greedy continuation, the drafter chained on its own features from each position
of that tail; acceptance[d] = the fraction of positions whose first d + 1 drafted tokens all equal
the target's greedy tokens (chain tau = 1 + sum). The loop itself (checkpoints, resume, Ctrl-C, DDP:
each rank trains on its share of every global batch, so the loss trajectory is the single
process's; progress) is heads/loop.py's, shared by every drafter.
"""
from __future__ import annotations

import copy
import sys
from typing import Callable

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F

from specdec.config import build_config
from specdec.errors import ConfigError
from specdec.models import has_native_bf16

from .config import TrainEagleConfig, is_eagle_config  # noqa: F401 - is_eagle_config: specdec.heads.eagle_train's name too
from .data import fixed_windows
from .eagle import EagleDrafter, eagle3_layers, layout_for_target
from .eagle3 import Eagle3Drafter, eagle3_layout_for_target, most_frequent_tokens
from .eagle_io import save_eagle
from .help import help_text
from .interrupt import training_main
from .loop import Drafter, Run, Setup, fmt, train
from .mtp import MtpDrafter, mtp_model_for, save_mtp

CHECKPOINT_FILE = "eagle_checkpoint.safetensors"
LEGACY_CHECKPOINT_FILE = "eagle_checkpoint.pt"    # a pickle, written before; refused, never read
LOG_FILE = "eagle_train.json"
LAYOUTS = ("eagle1", "eagle3", "mtp")
RUN = Run("eagle", "train-eagle", CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, LOG_FILE)
MTP_RUN = Run("eagle", "train-mtp", CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, LOG_FILE)   # the same run, named so


def validate(cfg) -> None:
    if not cfg.target:
        raise ConfigError("no target given: set target=/path/to/a/huggingface/checkpoint (e.g. `specdec train "
                          "eagle train_eagle target=... output_dir=...`); the command, given none, trains for the "
                          "default family")
    if cfg.layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got {cfg.layout!r}")
    if cfg.layout == "mtp":
        validate_mtp(cfg)
    for name in ("ttt_steps", "seq_len", "batch_size", "steps", "eval_windows", "eval_interval",
                 "checkpoint_interval", "eval_depth", "eval_new_tokens"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.seq_len < cfg.ttt_steps + 2:
        raise ConfigError(f"seq_len ({cfg.seq_len}) must be at least ttt_steps + 2 ({cfg.ttt_steps + 2})")
    if cfg.eval_new_tokens + 1 >= cfg.seq_len or cfg.eval_new_tokens <= cfg.eval_depth:
        raise ConfigError(f"need eval_depth ({cfg.eval_depth}) < eval_new_tokens ({cfg.eval_new_tokens}) < "
                          f"seq_len - 1 ({cfg.seq_len - 1})")
    if cfg.layout != "eagle3" and (cfg.norm_before_fc or cfg.norm_output or cfg.norm_before_residual):
        raise ConfigError("norm_before_fc, norm_output and norm_before_residual shape the EAGLE-3 drafter: "
                          "set layout=eagle3, or leave them false")
    if cfg.draft_vocab_size is not None and (cfg.layout != "eagle3" or cfg.draft_vocab_size < 1):
        raise ConfigError(f"draft_vocab_size={cfg.draft_vocab_size}: a reduced draft vocabulary is EAGLE-3's "
                          f"(layout=eagle3, draft_vocab_size >= 1; null = the whole vocabulary)")
    if cfg.intermediate_size is not None and cfg.intermediate_size < 1:
        raise ConfigError(f"intermediate_size must be >= 1 (or null: the target's), got {cfg.intermediate_size}")
    if not cfg.lr > 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.max_minutes is not None and not cfg.max_minutes > 0:
        raise ConfigError(f"max_minutes must be > 0 (or null: no time budget), got {cfg.max_minutes}")


def validate_mtp(cfg) -> None:
    """An MTP module is a decoder layer of the target's own shape, fed its last hidden state, trained in float32."""
    if cfg.feature_layers not in (None, [-1]):
        raise ConfigError(f"an MTP module reads the target's last hidden state (feature_layers null or [-1]), got "
                          f"feature_layers={list(cfg.feature_layers)}: use layout=eagle3 to fuse other layers")
    if cfg.intermediate_size is not None:
        raise ConfigError(f"an MTP module's decoder layer has the target's own shape (DeepSeek-V3's layout, as "
                          f"transformers' MtpModel builds it): leave intermediate_size null, got {cfg.intermediate_size}")
    if cfg.dtype != "float32":
        raise ConfigError(f"layout=mtp trains beside a float32 target (it shares the target's embedding and head; "
                          f"bf16=true runs the forwards in bfloat16): set dtype=float32, got {cfg.dtype!r}")


def load_train_eagle_config(name_or_path: str | None = None, overrides=None):
    cfg = build_config(TrainEagleConfig, name_or_path, overrides)
    validate(cfg)
    return cfg


# ---------------------------------------------------------------------- the unrolled objective
def ttt_visible(rows: int, step: int, device) -> torch.Tensor:
    """[1, rows, step * rows] bool: what step `step` (1-based) row s sees among the keys of steps
    1..step side by side: step-1 rows u <= s - step + 1, and the step-i rows s - step + i."""
    s = torch.arange(rows, device=device)[:, None]
    u = torch.arange(rows, device=device)[None]
    blocks = [u <= s - step + 1] + [u == s - (step - i) for i in range(2, step + 1)]
    return torch.cat(blocks, dim=1)[None]


def target_outputs(target, input_ids: torch.Tensor, layers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, T] ids -> (features [B, T, F], last hidden [B, T, H], logits [B, T, V]), fp32, no grad."""
    with torch.no_grad():
        out = target(input_ids=input_ids.to(target.device), output_hidden_states=True, use_cache=False)
        feats = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
        return feats.float(), out.hidden_states[-1].float(), out.logits.float()


class Unrolled(nn.Module):
    """The drafter unrolled ttt_steps times on its own outputs (one module call: DDP-friendly).
    Returns per-step (token loss [J], feature loss [J], top-1 agreement [J]) on the valid rows."""

    def __init__(self, drafter: EagleDrafter, steps: int, feature_loss: bool):
        super().__init__()
        self.drafter, self.steps, self.feature_loss = drafter, steps, feature_loss

    def forward(self, features, last_hidden, teacher_logits, input_ids):
        rows = features.shape[1] - 1                                  # row s: feature s, token s + 1
        tokens = input_ids[:, 1:].to(features.device)                 # [B, n]
        vocab = self.drafter.draft_vocab                              # [N] target ids (None: all V)
        teacher_best = teacher_logits[:, 1:].argmax(dim=-1)           # [B, n]: over the whole vocabulary
        if vocab is not None:                                         # EAGLE-3's reduced vocabulary: the
            teacher_logits = teacher_logits[..., vocab]               # target's distribution on it, renormalised
        teacher_probs = teacher_logits[:, 1:].softmax(dim=-1)         # [B, n, N]: token s + 2
        want_feature = last_hidden[:, 1:]                             # [B, n, H]: f_{s+1}
        positions = torch.arange(rows, device=features.device)[None].expand(features.shape[0], -1)
        g = self.drafter.input_features(features[:, :-1])             # [B, n, H]
        past_k = past_v = None
        token_losses, feature_losses, top1 = [], [], []
        for step in range(1, self.steps + 1):
            visible = ttt_visible(rows, step, features.device)
            out, _, k, v = self.drafter(g, tokens, positions, past_k, past_v, visible, with_logits=False)
            valid = slice(step - 1, rows)
            student = self.drafter.draft_logits(out[:, valid]).float().flatten(0, 1)   # [B * m, N]
            token_losses.append(F.cross_entropy(student, teacher_probs[:, valid].flatten(0, 1)))
            feature_losses.append(F.smooth_l1_loss(out[:, valid].float(), want_feature[:, valid])
                                  if self.feature_loss else student.new_zeros(()))
            with torch.no_grad():
                guess = student.argmax(-1) if vocab is None else vocab[student.argmax(-1)]
                top1.append((guess == teacher_best[:, valid].flatten()).float().mean())
            past_k = k if past_k is None else torch.cat([past_k, k], dim=2)
            past_v = v if past_v is None else torch.cat([past_v, v], dim=2)
            g = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)   # row s reads row s - 1's guess
        return torch.stack(token_losses), torch.stack(feature_losses), torch.stack(top1)


# ---------------------------------------------------------------------- held-out acceptance
class HeldOutAcceptance:
    """Held-out windows ending in the target's own greedy continuation; the drafter chained on its
    own features from every position of that tail, as at inference."""

    def __init__(self, target, windows: torch.Tensor, layers, new_tokens: int, depth: int, batch_size: int):
        prefix = windows[:, : windows.shape[1] - new_tokens]
        with torch.no_grad():
            sequences = target.generate(prefix.to(target.device), attention_mask=torch.ones_like(prefix).to(target.device),
                                        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                        pad_token_id=getattr(target.config, "pad_token_id", None) or 0).cpu()
        self.first_root = sequences.shape[1] - new_tokens - 1    # root row r: guesses token r + 2 >= prefix end
        self.depth = depth
        self.batches = []
        for i in range(0, sequences.shape[0], batch_size):
            ids = sequences[i: i + batch_size]
            self.batches.append((ids, *target_outputs(target, ids, layers)))

    @torch.no_grad()
    def evaluate(self, drafter: EagleDrafter, feature_loss: bool) -> dict:
        unrolled = Unrolled(drafter, self.depth, feature_loss)
        hits_total, count, losses = None, 0, []
        for ids, feats, last, logits in self.batches:
            rows = feats.shape[1] - 1
            positions = torch.arange(rows)[None].expand(feats.shape[0], -1).to(feats.device)
            tokens = ids[:, 1:].to(feats.device)
            best = logits[:, 1:].argmax(-1)                            # [B, n]
            g = drafter.input_features(feats[:, :-1])
            past_k = past_v = None
            hits = []                                                  # per step: [B, n] drafter == target
            for step in range(1, self.depth + 1):
                out, step_logits, k, v = drafter(g, tokens, positions, past_k, past_v,
                                                 ttt_visible(rows, step, feats.device))
                hits.append(step_logits.argmax(-1) == best)
                past_k = k if past_k is None else torch.cat([past_k, k], dim=2)
                past_v = v if past_v is None else torch.cat([past_v, v], dim=2)
                g = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
            roots = torch.arange(self.first_root, rows - self.depth + 1)   # every depth's guess in the tail
            chain = torch.ones(feats.shape[0], len(roots), dtype=torch.bool, device=feats.device)
            per_depth = []
            for d in range(self.depth):
                chain = chain & hits[d][:, roots + d]                    # depth d from root r: step d+1, row r+d
                per_depth.append(chain.float().sum(0).sum())
            part = torch.stack(per_depth)
            hits_total = part if hits_total is None else hits_total + part
            count += chain.numel()
            token_loss, _, _ = unrolled(feats, last, logits, ids)
            losses.append(token_loss * feats.shape[0])
        acceptance = (hits_total / count).tolist()
        loss = (torch.stack(losses).sum(0) / sum(b[0].shape[0] for b in self.batches)).tolist()
        return {"acceptance": acceptance, "chain_tau": 1 + sum(acceptance), "step_loss": loss}


# ---------------------------------------------------------------------- set-up
def feature_layers_for(cfg, target) -> tuple[int, ...]:
    if cfg.feature_layers:
        return tuple(int(i) for i in cfg.feature_layers)
    if cfg.layout in ("eagle1", "mtp"):
        return (-1,)
    return eagle3_layers(int(target.config.num_hidden_layers))


def build_drafter(cfg, target, stream: torch.Tensor | None = None) -> EagleDrafter | Eagle3Drafter | MtpDrafter:
    """A fresh fp32 drafter on the target's device with fp32 frozen copies of the target modules it
    reads; eagle3 with a reduced vocabulary: the `draft_vocab_size` tokens most frequent in `stream`;
    mtp: one fresh MTP module sharing the (float32, frozen) target's own embedding and head."""
    layers = feature_layers_for(cfg, target)
    if cfg.layout == "mtp":
        mtp = mtp_model_for(target, 1)
        mtp.layers.to(device=target.device, dtype=torch.float32)
        return MtpDrafter(mtp, id(target))
    if cfg.layout == "eagle1" and len(layers) != 1:
        raise ConfigError(f"layout eagle1 reads one layer, got feature_layers={list(layers)}: use layout=eagle3")
    if cfg.layout == "eagle3" and len(set(layers)) != len(layers):
        count = int(target.config.num_hidden_layers)
        raise ConfigError(f"an EAGLE-3 drafter fuses distinct target layers, and speculators / vLLM refuse repeats; "
                          f"feature_layers={list(layers)} repeats one (the target has {count} decoder layers): give "
                          f"feature_layers=[...] with distinct hidden_states indices in 0..{count}, or use layout=eagle1")
    if cfg.layout == "eagle3":
        layout = eagle3_layout_for_target(target, layers, cfg.draft_vocab_size, cfg.intermediate_size,
                                          norm_before_residual=bool(cfg.norm_before_residual),
                                          norm_before_fc=bool(cfg.norm_before_fc), norm_output=bool(cfg.norm_output))
        drafter = Eagle3Drafter(layout).to(target.device)
        if layout.reduced_vocab:
            if stream is None:
                raise ConfigError("a reduced draft vocabulary is picked from the training corpus: none given")
            drafter.set_draft_vocab(most_frequent_tokens(stream, layout.draft_vocab_size, layout.vocab_size))
        start_from_target_head(drafter, target)
    else:
        drafter = EagleDrafter(layout_for_target(target, layers, cfg.intermediate_size)).to(target.device)
        drafter.attach_lm_head(copy.deepcopy(target.get_output_embeddings()).float().requires_grad_(False))
    drafter.attach_embedding(copy.deepcopy(target.get_input_embeddings()).float().requires_grad_(False))
    return drafter


def start_from_target_head(drafter: Eagle3Drafter, target) -> None:
    """The drafter's lm_head starts as (and stays, frozen, as speculators trains it) the target's rows of
    its draft vocabulary; its final norm starts as the target's final norm, which those rows were
    trained behind."""
    with torch.no_grad():
        head = target.get_output_embeddings().weight.float()                   # [V, H]
        vocab = drafter.draft_vocab
        drafter.lm_head.weight.copy_(head if vocab is None else head[vocab.to(head.device)])
        final_norm = getattr(getattr(target, "model", None), "norm", None)
        weight = getattr(final_norm, "weight", None)
        if weight is not None and weight.shape == drafter.norm.weight.shape:
            drafter.norm.weight.copy_(weight.float())
    drafter.lm_head.weight.requires_grad_(False)


# ---------------------------------------------------------------------- the drafter in the loop
def eagle_drafter(setup: Setup) -> Drafter:
    """An EAGLE drafter in the training loop (heads/loop.py): the unrolled loss, held-out acceptance."""
    cfg, target, ddp = setup.cfg, setup.target, setup.ddp
    drafter = build_drafter(cfg, target, setup.train_stream)
    layers = drafter.layout.feature_layers
    feature_loss = cfg.layout == "eagle1" and cfg.feature_loss_weight > 0
    heldout = None
    if ddp.main:
        heldout = HeldOutAcceptance(target, fixed_windows(setup.heldout_stream, cfg.seq_len, cfg.eval_windows),
                                    layers, cfg.eval_new_tokens, cfg.eval_depth, cfg.batch_size)
    unrolled = ddp.wrap(Unrolled(drafter, cfg.ttt_steps, feature_loss))
    weights = torch.tensor([cfg.step_loss_decay ** j for j in range(cfg.ttt_steps)], device=setup.device)   # [J]
    bf16 = has_native_bf16(setup.device) if cfg.bf16 is None else bool(cfg.bf16)
    autocast = torch.autocast(setup.device.type, dtype=torch.bfloat16, enabled=bf16)

    def loss(windows: torch.Tensor, step: int):
        with autocast:
            feats, last, teacher_logits = target_outputs(target, windows, layers)
            token_loss, feat_loss, top1 = unrolled(feats, last, teacher_logits, windows)             # [J] each
            total = (weights * (token_loss + cfg.feature_loss_weight * feat_loss)).sum()
        return total, {"top1": ddp.mean(top1).tolist()}

    def evaluate(step: int, full: bool) -> dict:
        drafter.eval()
        with autocast:
            result = heldout.evaluate(drafter, feature_loss)
        drafter.train()
        return result

    def finish(steps: int, final: dict, elapsed: float) -> None:
        save = save_mtp if cfg.layout == "mtp" else save_eagle
        save(cfg.output_dir, drafter, target, training={
            "steps": steps, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "ttt_steps": cfg.ttt_steps,
            "layout": cfg.layout, "heldout": {k: final[k] for k in ("acceptance", "chain_tau", "step_loss")}})

    # an MTP module's own weights are its layers (the embedding and head it holds are the target's, not saved)
    trained = drafter.mtp.layers if cfg.layout == "mtp" else drafter
    return Drafter(module=trained, loss=loss, evaluate=evaluate, finish=finish, layout=drafter.layout.as_dict(),
                   describe=lambda r: (f"held-out acceptance per depth {fmt(r['acceptance'])} (chain tau "
                                       f"{r['chain_tau']:.2f}) | step losses {fmt(r['step_loss'])}"),
                   postfix=lambda m, last: f"loss {m['loss']:.3f} top1/step {fmt(m['top1'])}",
                   extra={"layout": drafter.layout.as_dict(), "bf16": bf16})


def train_eagle(cfg, on_step: Callable[[int, dict], None] | None = None) -> str:
    """Train (or resume) an EAGLE drafter as `cfg` (TrainEagleConfig) says; returns the output folder."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainEagleConfig), OmegaConf.structured(cfg))
    validate(cfg)
    return train(cfg, MTP_RUN if cfg.layout == "mtp" else RUN, eagle_drafter, on_step)


def main(argv: list[str] | None = None, cli: str = "specdec train-heads") -> int:
    """specdec train-heads train_eagle [key=value ...]  (or a YAML with `drafter: eagle`)"""
    return training_main(argv, show_help=lambda name: print(help_text(name, eagle=True)),
                         load_config=load_train_eagle_config, train=train_eagle, cli=cli,
                         module="specdec.heads.eagle_train", saved="EAGLE drafter saved in {folder}")


def load_train_mtp_config(name_or_path: str | None = None, overrides=None):
    """The EAGLE trainer's config with layout=mtp (the default when no config file is named); a config or
    override that sets another layout is refused."""
    overrides = list(overrides or [])
    cfg = build_config(TrainEagleConfig, name_or_path, overrides if name_or_path else ["layout=mtp"] + overrides)
    if cfg.layout != "mtp":
        raise ConfigError(f"`specdec train mtp` trains layout=mtp, and this config sets layout={cfg.layout}: run it "
                          f"with `specdec train eagle`, or use the shipped train_mtp")
    validate(cfg)
    return cfg


def mtp_main(argv: list[str] | None = None, cli: str = "specdec train mtp") -> int:
    """specdec train mtp [CONFIG] [key=value ...]: one MTP module for a target that ships none (layout=mtp)."""
    return training_main(argv, show_help=lambda name: print(help_text(name, eagle=True)),
                         load_config=load_train_mtp_config, train=train_eagle, cli=cli,
                         module="specdec.heads.eagle_train", saved="MTP module saved in {folder} (draft with it: "
                                                                   "specdec generate mtp mtp.path={folder} ...)")


if __name__ == "__main__":
    sys.exit(main())
