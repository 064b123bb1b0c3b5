"""The family's target: a small Llama causal LM, pretrained from scratch by the library's one training
loop (heads/loop.py) as a plug-in, as every drafter is: the loop draws the seeded windows, follows
the warmup-then-cosine schedule, clips, checkpoints (safetensors and JSON), resumes, shows the
progress and measures the held-out loss at the start and the end; this module brings the model, its
loss, its evaluation and its output. (The draft is distilled into it by `specdec train-draft`'s code:
family/heads.py.)

    pretrain_target(cfg, tokenizer_folder, split, work, out)

`work` holds the run: the freshly initialised model it starts from, which the loop loads as its
target, the loop's checkpoint and log. A build interrupted there goes on from its last checkpoint
when rerun, to the weights an uninterrupted build makes. `out` gets the trained model, its
tokenizer, train.json (the record the build reports) and the loop's log.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdec.atomic import atomic_folder, atomic_write_json
from specdec.heads.data import fixed_windows, sample_windows
from specdec.heads.loop import Drafter, Run, Setup, train

from .heads import part_train_config

RUN = Run("pretrain", "train target", "pretrain_checkpoint.safetensors", None, "train_target.json")
INIT_FOLDER = "init"        # in the work folder: the freshly initialised model, the loop's starting point
BETAS = (0.9, 0.95)         # AdamW's: GPT's short memory of the squared gradients, for a short run at a high lr


def new_llama(lm_cfg, vocab_size: int, special_id: int, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=lm_cfg.hidden_size,
                         intermediate_size=lm_cfg.intermediate_size, num_hidden_layers=lm_cfg.num_layers,
                         num_attention_heads=lm_cfg.num_heads, num_key_value_heads=lm_cfg.num_heads,
                         max_position_embeddings=lm_cfg.max_position_embeddings, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=special_id, eos_token_id=special_id,
                         pad_token_id=special_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def window_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) over the windows  # windows: [batch, seq_len + 1]"""
    logits = model(input_ids=windows[:, :-1]).logits                       # [batch, seq_len, vocab]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


def builder_windows(stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """The windows the family builder has always drawn for its target: uniform starts that stop one
    short of the stream's last possible one. The loop's own sampler (heads.data.sample_windows) reaches
    that start too, so from the same seed it draws other windows: statistically the same (six window
    seeds each, benchmarks/results/training_loop/README.md), but another target. Drawing these keeps the
    default family's target bit-identical to the builds made before it trained in the loop, so the
    figures measured on it stand.  # [batch_size, seq_len]"""
    return sample_windows(stream, seq_len, batch_size, generator, reach_end=False)


def adamw_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on the matrices only (not on the norms' gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay, "betas": BETAS},
            {"params": no_decay, "weight_decay": 0.0, "betas": BETAS}]


def pretrain_plugin(setup: Setup, out: str) -> Drafter:
    """The loop's target (the freshly initialised model) trained whole on the next-token cross-entropy;
    its held-out loss on fixed held-out windows; at the end it is written to `out`."""
    cfg, model, ddp = setup.cfg, setup.target, setup.ddp
    model.requires_grad_(True)
    student = ddp.wrap(model)
    heldout = fixed_windows(setup.heldout_stream, cfg.seq_len, cfg.eval_windows) if ddp.main else None   # [n, T]

    def loss(windows: torch.Tensor, step: int):
        return window_loss(student, windows.to(setup.device)), {}

    @torch.no_grad()
    def evaluate(step: int, full: bool) -> dict:
        was_training = model.training
        value = float(window_loss(model.eval(), heldout.to(setup.device)))
        model.train(was_training)
        return {"heldout_loss": value}

    def describe(result: dict) -> str:
        return f"held-out loss {result['heldout_loss']:.4f}"

    def postfix(metrics: dict, last: dict | None) -> str:
        return f"loss {metrics['loss']:.3f} lr {metrics['lr']:.1e}"

    def finish(steps: int, final: dict, elapsed: float) -> None:
        model.eval().save_pretrained(out)
        setup.tokenizer.save_pretrained(out)

    return Drafter(module=model, loss=loss, evaluate=evaluate, describe=describe, postfix=postfix, finish=finish,
                   extra={"parameters": sum(p.numel() for p in model.parameters())},
                   param_groups=adamw_groups(model, cfg.weight_decay), windows=builder_windows)


def pretrain_target(cfg, tokenizer_folder: str, split, work: str, out: str) -> dict:
    """Pretrain the family's target (cfg: a FamilyConfig; cfg.target: the shape and the recipe) on the
    split's training files in the run folder `work`, going on from its checkpoint when there is one;
    write it to `out`. Returns the record written to out/train.json."""
    recipe = cfg.target.train
    init = os.path.join(work, INIT_FOLDER)
    if not os.path.isdir(init):        # a rerun starts from the same weights (the checkpoint checks their fingerprint)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
        model = new_llama(cfg.target, len(tokenizer), tokenizer.eos_token_id, cfg.seed)
        model.generation_config.pad_token_id = tokenizer.eos_token_id
        atomic_folder(init, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))
    section = OmegaConf.create({
        **OmegaConf.to_container(recipe),
        "seq_len": recipe.seq_len + 1,          # the loop's windows: seq_len inputs and the token after the last
        "seed": cfg.seed, "eval_interval": recipe.steps,     # the held-out loss at the start and the end
        "corpus": [], "heldout": [], "device": "cpu", "dtype": "float32", "progress": True})
    train(part_train_config(section, init, split, cfg, work), RUN, lambda setup: pretrain_plugin(setup, out))
    with open(os.path.join(work, RUN.log)) as f:
        run = json.load(f)
    shutil.copyfile(os.path.join(work, RUN.log), os.path.join(out, RUN.log))
    record = {"role": "target", "parameters": run["parameters"], "steps": run["steps_done"],
              "train_tokens": run["steps_done"] * recipe.batch_size * recipe.seq_len,
              "first_loss": run["losses"][0], "last_loss": run["losses"][-1],
              "heldout_loss_at_start": run["history"][0]["heldout_loss"],
              "heldout_loss": run["history"][-1]["heldout_loss"], "minutes": run["train_time_s"] / 60}
    atomic_write_json(os.path.join(out, "train.json"), record, indent=1)
    return record
