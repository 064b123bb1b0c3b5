"""`specdec train-draft`: distil a draft model into its target (DistillSpec, Zhou et al. 2024).

    specdec train-draft train_draft draft=PATH_OR_null target=PATH output_dir=PATH
    torchrun --nproc_per_node=2 -m specdec.heads.distill train_draft ...        (DDP, gloo or nccl)

A drafted token is accepted with probability 1 - TV(target, draft), so the draft is trained on the
target's distributions rather than on the text. Each step: a batch of windows (`data`: corpus text,
continuations the draft samples itself from corpus prompts - on-policy -, continuations the
target samples through our own speculative decoding, or a mix with a fraction `mix_lambda` of
on-policy batches) -> one no-grad target forward over the windows -> the draft's forward -> the
configured divergence (distill_loss) between the two distributions at every position of the
part the batch is about (the whole window for text, the generated tail otherwise).

Held-out evaluation (at start, every eval_interval steps and at the end): on fixed held-out
windows the per-position expected acceptance 1 - TV at temperature 1 and the greedy match rate;
and the chain tau (tokens per target forward) of our own draft_model strategy, gamma = eval_gamma,
on held-out prompts, greedy and at eval_temperature. Checkpoints are atomic and re-running with
the same output_dir resumes from the last one (exactly: the window sampler's state is saved and
every step's other random draws are keyed by (seed, step); safetensors and JSON, heads/checkpoint.py,
never a pickle). The output folder is a plain Hugging
Face checkpoint (config, safetensors, tokenizer) plus distill.json: the target it was distilled
for and the recipe.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch
from omegaconf import OmegaConf

from specdec.api import Speculator
from specdec.atomic import atomic_files_into, atomic_write_json
from specdec.config import build_config, find_config_file, setting
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.models import DTYPES, cache_kwargs, check_same_tokenizer, load_model, load_tokenizer, output_vocab_size
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.strategies.draft_model import DraftModel

from .data import fixed_windows
from .distill_loss import distill_loss, loss_weights
from .draft_info import FORMAT, INFO_FILE, read_distill_info, warn_if_distilled_for_another_target  # noqa: F401
from .help import keys_help
from .interrupt import training_main
from .loop import Drafter, Run, Setup, train

CHECKPOINT_FILE = "draft_checkpoint.safetensors"
LEGACY_CHECKPOINT_FILE = "draft_checkpoint.pt"    # a pickle, written before; refused, never read
LOG_FILE = "train_draft.json"
RUN = Run("draft", "train-draft", CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, LOG_FILE)
DATA_MODES = ("fixed", "draft", "target", "mixed")


@dataclass
class DraftShape:
    """A fresh draft (draft=null): the target's architecture and config, at this size."""
    hidden_size: int = setting(192, min=1)
    num_layers: int = setting(2, min=1)
    num_heads: int = setting(3, min=1)
    intermediate_size: Optional[int] = setting(None, min=1)   # None = 8/3 of hidden_size


@dataclass
class TrainDraftConfig:
    target: Optional[str] = None        # Hugging Face checkpoint folder of the (frozen) target
    draft: Optional[str] = None         # the draft to fine-tune (same tokenizer); null = a fresh one (draft_config)
    tokenizer: Optional[str] = None     # the target's tokenizer folder when it is not beside its weights
    output_dir: str = "draft-out"       # the distilled draft (a HF checkpoint) + checkpoint + log; re-run to resume
    draft_config: DraftShape = field(default_factory=DraftShape)
    corpus: List[str] = field(default_factory=list)     # files / folders; [] = the whole standard library
    corpus_root: Optional[str] = None
    heldout: List[str] = field(default_factory=list)
    split_file: Optional[str] = None    # JSON with "train" / "heldout" file lists
    # objective
    loss: Any = "rkl"                   # fkl | rkl | jsd | tvd, or a mix such as {rkl: 0.9, ce: 0.1}
    jsd_beta: float = setting(0.5, above=0.0, max=1.0)   # jsd: m = beta p + (1 - beta) q (below 1)
    loss_temperature: float = setting(1.0, min=0.0)   # the temperature you will sample with; 0 = greedy (argmax)
    loss_top_k: int = setting(0, min=0)                # the target's top-k filter (0 = off)
    loss_top_p: float = setting(1.0, above=0.0, max=1.0)   # the target's top-p filter (1 = off)
    # data
    data: str = setting("fixed", choices=DATA_MODES)   # fixed text | draft (on-policy) | target | mixed
    mix_lambda: float = setting(0.5, min=0.0, max=1.0)   # mixed: the fraction of on-policy batches
    prompt_tokens: int = setting(64, min=1)            # generated data: corpus tokens before the continuation
    sample_temperature: float = setting(1.0, min=0.0)  # generated data: the sampling temperature (0 = greedy)
    # optimisation
    seq_len: int = setting(256, min=2)
    batch_size: int = setting(8, min=1)                # global batch (split across torchrun ranks)
    steps: int = setting(1000, min=1)
    max_minutes: Optional[float] = setting(None, above=0.0)   # also stop after this much training time (summed
    #   over resumes); the lr schedule then follows whichever of steps / time is further along
    lr: float = setting(1e-3, above=0.0)
    min_lr_ratio: float = setting(0.1, min=0.0, max=1.0)
    warmup_steps: int = setting(20, min=0)
    weight_decay: float = setting(0.0, min=0.0)
    grad_clip: float = setting(1.0, min=0.0)
    bf16: bool = False                  # bf16 autocast for the target's and the draft's forwards (slower on a CPU
    #   without native bf16 matmuls, such as AVX2 ones: benchmarks/results/distill/README.md)
    threads: int = setting(1, min=0)    # torch's CPU threads (intra-op) while training; 0 = torch's default (one per
    #   core). 1 because the per-token forwards of on-policy sampling and of the chain tau are too small to split,
    #   and a second thread that the scheduler gives to another process stalls every op on it, so on a busy CPU
    #   steps run several times slower (benchmarks/results/distill/README.md). Restored when train_draft returns
    # bookkeeping
    seed: int = setting(0, min=0)
    eval_interval: int = setting(200, min=1)
    eval_windows: int = setting(8, min=1)              # held-out windows of seq_len tokens (1 - TV, greedy match)
    eval_prompts: int = setting(8, min=0)              # held-out prompts for the chain tau (0 = skip it)
    tau_interval: int = setting(0, min=0)              # also measure the chain tau every tau_interval steps (0: only
    #   at the start and the end; the evaluations between measure 1 - TV and the greedy match, which are cheap)
    eval_prompt_tokens: int = setting(64, min=1)
    eval_new_tokens: int = setting(64, min=1)
    eval_gamma: int = setting(4, min=1)
    eval_temperature: float = setting(0.8, above=0.0)  # the sampled tau's temperature (greedy is always measured)
    checkpoint_interval: int = setting(50, min=1)
    device: str = "cpu"
    dtype: str = setting("float32", choices=tuple(DTYPES))   # the target's dtype (the draft trains in fp32)
    backend: Optional[str] = None       # torch.distributed backend under torchrun (None: nccl on CUDA, else gloo)
    progress: bool = True


def validate(cfg) -> None:
    if not cfg.target:
        raise ConfigError("no target given: set target=/path/to/a/huggingface/checkpoint (e.g. `specdec train "
                          "draft train_draft target=... draft=... output_dir=...`); the command, given none, trains "
                          "for the default family")
    weights = loss_weights(OmegaConf.to_container(cfg.loss) if OmegaConf.is_config(cfg.loss) else cfg.loss)
    if "jsd" in weights and not cfg.jsd_beta < 1:
        raise ConfigError(f"jsd_beta must be below 1 (at 0 or 1 the JSD is 0 everywhere), got {cfg.jsd_beta}")
    if cfg.data != "fixed" and cfg.prompt_tokens >= cfg.seq_len - 1:
        raise ConfigError(f"prompt_tokens ({cfg.prompt_tokens}) must leave room for a continuation in seq_len "
                          f"({cfg.seq_len}): data={cfg.data} generates seq_len - prompt_tokens tokens")


def load_train_draft_config(name_or_path: str | None = None, overrides=None):
    cfg = build_config(TrainDraftConfig, name_or_path, overrides)
    validate(cfg)
    return cfg


def loss_spec(cfg) -> dict[str, float]:
    return loss_weights(OmegaConf.to_container(cfg.loss) if OmegaConf.is_config(cfg.loss) else cfg.loss)


# ---------------------------------------------------------------------- models
def new_draft(target, shape, seed: int):
    """A fresh fp32 draft of the target's own architecture and config (tokenizer, positions, special
    ids), resized to `shape`."""
    from transformers import AutoModelForCausalLM
    config = copy.deepcopy(target.config)
    if shape.hidden_size % shape.num_heads:
        raise ConfigError(f"draft_config.hidden_size ({shape.hidden_size}) must be a multiple of "
                          f"draft_config.num_heads ({shape.num_heads})")
    sizes = {"hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_layers,
             "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_heads,
             "intermediate_size": shape.intermediate_size or 8 * shape.hidden_size // 3,
             "head_dim": shape.hidden_size // shape.num_heads}
    for name, value in sizes.items():
        if hasattr(config, name) or name in getattr(config, "attribute_map", {}):
            setattr(config, name, value)
    if hasattr(config, "layer_types") and isinstance(config.layer_types, list):
        config.layer_types = config.layer_types[: shape.num_layers]
    config.dtype = torch.float32
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).float()


def load_draft(cfg, target, tokenizer, device):
    """The draft to train, fp32 on `device`: the given checkpoint (checked to share the target's
    tokenizer) or a fresh one."""
    if cfg.draft is None:
        return new_draft(target, cfg.draft_config, cfg.seed + 1).to(device)
    draft = load_model(cfg.draft, "draft", device, torch.float32, key="draft")
    draft_tokenizer = None
    if any(os.path.isfile(os.path.join(cfg.draft, name)) for name in ("tokenizer.json", "tokenizer_config.json")):
        draft_tokenizer = load_tokenizer(cfg.draft, "draft", key="draft")
    try:
        check_same_tokenizer(tokenizer, draft_tokenizer, output_vocab_size(target), output_vocab_size(draft))
    except IncompatibleModelsError as exc:
        raise IncompatibleModelsError(f"draft={cfg.draft!r} cannot be distilled into target={cfg.target!r}: {exc}; "
                                      f"or give draft=null to start a fresh draft of the target's family "
                                      f"(sized by draft_config)") from None
    return draft


# ---------------------------------------------------------------------- data
@torch.no_grad()
def sample_continuations(model, prompts: torch.Tensor, new_tokens: int, temperature: float,
                         generator: torch.Generator) -> torch.Tensor:
    """[B, P] prompts -> [B, P + new_tokens]: the model's own continuations, all rows in one batch
    (a KV cache, one forward per token), sampled at `temperature` (0: greedy) from `generator`.
    EOS is not special: every row gets exactly new_tokens."""
    from specdec.cache import new_cache
    was_training = model.training
    model.eval()
    cache = new_cache(model)
    params = None if temperature == 0 else SamplingParams(temperature=temperature)
    ids, step_input, out = prompts, prompts, []
    for _ in range(new_tokens):
        logits = model(input_ids=step_input, use_cache=True, **cache_kwargs(model, cache)).logits[:, -1].float()
        if params is None:
            token = logits.argmax(-1, keepdim=True)                                # [B, 1]
        else:
            probs = logits_to_probs(logits, params)                               # [B, V]
            token = torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)
        out.append(token)
        step_input = token
    model.train(was_training)
    return torch.cat([ids, *out], dim=1)


def target_continuations(target, tokenizer, draft, prompts: torch.Tensor, new_tokens: int, temperature: float,
                         seed: int) -> torch.Tensor:
    """[B, P] -> [B, P + new_tokens] sampled from the *target*, through our own speculative decoding
    (draft_model with the draft being trained: the target's law, fewer target forwards)."""
    was_training = draft.training
    speculator = Speculator(target, tokenizer, DraftModel(draft, num_tokens=4))
    outs = speculator.generate([row.tolist() for row in prompts], max_new_tokens=new_tokens, temperature=temperature,
                               seed=[seed + i for i in range(len(prompts))] if temperature > 0 else None,
                               ignore_eos=True)
    draft.train(was_training)
    return torch.cat([prompts, torch.tensor([o.token_ids for o in outs], dtype=torch.long)], dim=1)


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The random source of one step's draws other than the windows (which data, the samples), keyed
    by (seed, step, rank): a resumed or redone step draws exactly what it drew the first time."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 8191 + rank) % (2 ** 63))


def batch_source(cfg, step: int, rank: int) -> str:
    """Which data this step trains on: fixed | draft | target (mixed: on-policy with prob mix_lambda)."""
    if cfg.data != "mixed":
        return cfg.data
    coin = torch.rand((), generator=step_generator(cfg.seed, step, 0)).item()   # the same on every rank
    return "draft" if coin < cfg.mix_lambda else "fixed"


# ---------------------------------------------------------------------- held-out evaluation
class HeldOut:
    """Fixed held-out windows with the target's logits computed once, and held-out prompts for
    the chain tau of our own draft_model strategy."""

    def __init__(self, cfg, target, tokenizer, windows: torch.Tensor):
        self.cfg, self.target, self.tokenizer = cfg, target, tokenizer
        self.batches = []
        with torch.no_grad():
            for i in range(0, windows.shape[0], cfg.batch_size):
                ids = windows[i: i + cfg.batch_size]
                self.batches.append((ids, target(input_ids=ids.to(target.device)).logits.float()))
        prompt_len = min(cfg.eval_prompt_tokens, windows.shape[1])
        self.prompts = [row[:prompt_len].tolist() for row in windows[: cfg.eval_prompts]]

    @torch.no_grad()
    def evaluate(self, draft, tau: bool = True) -> dict:
        was_training = draft.training
        draft.eval()
        accept, match, count = 0.0, 0.0, 0
        for ids, target_logits in self.batches:
            draft_logits = draft(input_ids=ids.to(target_logits.device)).logits.float()     # [b, T, V]
            draft_logits = draft_logits[..., : target_logits.shape[-1]]
            tv = 0.5 * (target_logits.softmax(-1) - draft_logits.softmax(-1)).abs().sum(-1)   # [b, T]
            accept += float((1 - tv).sum())
            match += float((target_logits.argmax(-1) == draft_logits.argmax(-1)).sum())
            count += tv.numel()
        result = {"acceptance_t1": accept / count, "greedy_match": match / count}
        if self.prompts and tau:
            result["tau_greedy"] = self.chain_tau(draft, 0.0)
            result[f"tau_t{self.cfg.eval_temperature:g}"] = self.chain_tau(draft, self.cfg.eval_temperature)
        draft.train(was_training)
        return result

    def chain_tau(self, draft, temperature: float) -> float:
        """Tokens per target forward of draft_model (a chain of eval_gamma) on the held-out prompts."""
        speculator = Speculator(self.target, self.tokenizer, DraftModel(draft, num_tokens=self.cfg.eval_gamma))
        outs = speculator.generate(self.prompts, max_new_tokens=self.cfg.eval_new_tokens, temperature=temperature,
                                   seed=[self.cfg.seed + i for i in range(len(self.prompts))] if temperature else None,
                                   ignore_eos=True)
        return sum(o.stats.new_tokens for o in outs) / max(1, sum(o.stats.target_forwards for o in outs))


def describe(result: dict) -> str:
    taus = " ".join(f"{k[4:]} {v:.2f}" for k, v in result.items() if k.startswith("tau_"))
    return (f"held-out 1-TV {result['acceptance_t1']:.3f} | greedy match {result['greedy_match']:.3f}"
            + (f" | chain tau (gamma) {taus}" if taus else ""))


# ---------------------------------------------------------------------- saving
def save_distilled(folder: str, draft, tokenizer, info: dict) -> None:
    """The draft as a plain Hugging Face checkpoint (config, safetensors, tokenizer files) and
    distill.json, written last: each file is moved into place whole, so a folder with distill.json
    holds a complete draft."""
    def write(tmp: str) -> None:
        draft.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    atomic_files_into(folder, write)
    atomic_write_json(os.path.join(folder, INFO_FILE), info, indent=2)


# ---------------------------------------------------------------------- the drafter in the loop
def draft_drafter(setup: Setup) -> Drafter:
    """A draft model in the training loop (heads/loop.py): the divergence on this step's data, held-out
    1 - TV, greedy match and chain tau."""
    cfg, target, tokenizer, ddp = setup.cfg, setup.target, setup.tokenizer, setup.ddp
    weights = loss_spec(cfg)
    draft = load_draft(cfg, target, tokenizer, setup.device)
    heldout = None
    if ddp.main:
        heldout = HeldOut(cfg, target, tokenizer, fixed_windows(setup.heldout_stream, cfg.seq_len, cfg.eval_windows))
    student = ddp.wrap(draft)
    autocast = torch.autocast(setup.device.type, dtype=torch.bfloat16, enabled=bool(cfg.bf16))

    def loss(windows: torch.Tensor, step: int):
        source = batch_source(cfg, step, ddp.rank)
        ids, first = make_batch(cfg, source, windows, step, ddp.rank, target, tokenizer, draft)       # [b, T]
        ids = ids.to(setup.device)
        with autocast:
            with torch.no_grad():
                target_logits = target(input_ids=ids).logits[:, first:-1]                  # [b, n, V]
            draft_logits = student(input_ids=ids).logits[:, first:-1]                      # [b, n, Vd]
        vocab = target_logits.shape[-1]
        total, parts = distill_loss(weights, target_logits.float().flatten(0, 1),
                                    draft_logits[..., :vocab].float().flatten(0, 1), ids[:, first + 1:].flatten(),
                                    temperature=cfg.loss_temperature, top_k=cfg.loss_top_k,
                                    top_p=cfg.loss_top_p, beta=cfg.jsd_beta)
        return total, {"parts": parts, "data": source}

    def evaluate(step: int, full: bool) -> dict:
        return heldout.evaluate(draft, tau=full or (bool(cfg.tau_interval) and step % cfg.tau_interval == 0))

    def postfix(metrics: dict, last: dict | None) -> str:
        shown = f" | held-out 1-TV {last['acceptance_t1']:.3f}" if last else ""
        return f"loss {metrics['loss']:.4f}{shown}"

    def finish(steps: int, final: dict, elapsed: float) -> None:
        recipe = {key: OmegaConf.to_container(cfg)[key] for key in (
            "loss", "jsd_beta", "loss_temperature", "loss_top_k", "loss_top_p", "data", "mix_lambda",
            "prompt_tokens", "sample_temperature", "seq_len", "batch_size", "lr", "seed", "draft", "draft_config")}
        info = {"format": FORMAT, "version": 1, "target": setup.identity,
                "recipe": {**recipe, "steps": steps, "train_time_s": elapsed, "processes": ddp.world},
                "heldout": {k: v for k, v in final.items() if k != "step"}}
        save_distilled(cfg.output_dir, draft, tokenizer, info)

    return Drafter(module=draft, loss=loss, evaluate=evaluate, describe=describe, postfix=postfix, finish=finish,
                   extra={"draft_parameters": sum(p.numel() for p in draft.parameters())})


def train_draft(cfg, on_step: Callable[[int, dict], None] | None = None) -> str:
    """Distil (or resume distilling) a draft as `cfg` (TrainDraftConfig) says; returns the output folder."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainDraftConfig), OmegaConf.structured(cfg))
    validate(cfg)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return train(cfg, RUN, draft_drafter, on_step)
    finally:
        torch.set_num_threads(threads)


def make_batch(cfg, source: str, windows: torch.Tensor, step: int, rank: int, target, tokenizer, draft):
    """(ids [b, T], first position scored): corpus windows as they are (all positions), or their
    first prompt_tokens followed by a continuation the draft (on-policy) or the target samples."""
    if source == "fixed":
        return windows, 0
    prompts = windows[:, : cfg.prompt_tokens].to(draft.device)
    new_tokens = cfg.seq_len - cfg.prompt_tokens
    if source == "draft":
        ids = sample_continuations(draft, prompts, new_tokens, cfg.sample_temperature,
                                   step_generator(cfg.seed, step, rank))
    else:
        seed = int(torch.randint(0, 2 ** 31 - 1, (), generator=step_generator(cfg.seed, step, rank)))
        ids = target_continuations(target, tokenizer, draft, prompts.cpu(), new_tokens, cfg.sample_temperature, seed)
    return ids, cfg.prompt_tokens - 1


# ---------------------------------------------------------------------- command line
USAGE = ("usage: specdec train-draft [CONFIG] [key=value ...]\n"
         "CONFIG: a shipped config (train_draft) or a YAML path; values are YAML: draft=null "
         "loss={rkl: 0.9, ce: 0.1} data=draft; re-running with the same output_dir resumes")


def help_text(name: str | None) -> str:
    where = f" ({find_config_file(name)})" if name else ""
    return (f"{USAGE}\n\ndistils a draft model into its target{where}; keys"
            f"{', with this config' + chr(39) + 's values' if name else ' (defaults)'}:\n"
            f"{keys_help(TrainDraftConfig, name)}")


def main(argv: list[str] | None = None, cli: str = "specdec train-draft") -> int:
    """specdec train-draft [CONFIG_NAME_OR_YAML] [key=value ...]"""
    return training_main(argv, show_help=lambda name: print(help_text(name)), load_config=load_train_draft_config,
                         train=train_draft, cli=cli, module="specdec.heads.distill",
                         saved="distilled draft saved in {folder} (use it as draft.path={folder})")

if __name__ == "__main__":
    sys.exit(main())
