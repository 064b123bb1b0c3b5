"""The public API: specdec.load(...) and specdec.Speculator(target, tokenizer, strategy)."""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from .config import SpecConfig, load_spec_config
from .coupled import make_noise
from .errors import InputError
from .loop import decode
from .models import context_length, load_model, load_tokenizer, output_vocab_size, resolve_device, resolve_dtype
from .sampling import SamplingParams, make_generator
from .stopping import StopRules
from .types import GenerationOutput, Stats
from .verifier import Verifier


class Speculator:
    """Speculative generation with `strategy` on `target`. Output law = the target's own."""

    def __init__(self, target, tokenizer, strategy, *, config: SpecConfig | None = None):
        from .strategies import Strategy
        if isinstance(strategy, str):
            strategy = _strategy_by_name(strategy, config)
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must follow specdec.strategies.Strategy (bind/reset/propose/observe), "
                            f"got {type(strategy).__name__}")
        self.target = target.eval()
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.config = config
        self.verifier = Verifier(self.target)
        self.context = context_length(self.target, tokenizer)
        strategy.bind(self.target, tokenizer)

    # ------------------------------------------------------------------ inputs
    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() == 2:
                if prompt.shape[0] != 1:
                    raise InputError(f"batch size {prompt.shape[0]} > 1 is not supported yet: "
                                     f"call generate once per prompt")
                prompt = prompt[0]
            prompt = prompt.tolist()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("a text prompt needs a tokenizer: pass one to Speculator or give token ids")
            ids = self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(p, (str, list, tuple)) for p in prompt):
            raise InputError(f"batch size {len(prompt)} > 1 is not supported yet: call generate once per prompt")
        elif isinstance(prompt, Sequence) and not prompt:
            ids = []
        else:
            raise InputError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InputError("the prompt is empty: give at least one token")
        vocab = self.target.get_input_embeddings().num_embeddings
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(f"prompt token id {bad[0]} is outside the model's vocabulary of {vocab} ids (0..{vocab - 1})")
        return ids

    def _check_length(self, n_prompt: int, max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if self.context is None:
            return
        if n_prompt >= self.context:
            raise InputError(f"the prompt has {n_prompt} tokens but the model's context is {self.context}: "
                             f"shorten the prompt (keep its last {self.context - max_new_tokens} tokens, say)")
        if n_prompt + max_new_tokens > self.context:
            raise InputError(f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                             f"context of {self.context} tokens: lower max_new_tokens to "
                             f"{self.context - n_prompt} or shorten the prompt")

    def _eos_ids(self) -> frozenset[int]:
        eos = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return frozenset()
        return frozenset([eos] if isinstance(eos, int) else eos)

    # ------------------------------------------------------------------ generation
    def _sampler(self, sampler: str | None) -> str:
        """The sampler asked for, else the config's generation.sampler, else "rejection"."""
        if sampler is not None:
            return sampler
        return self.config.generation.sampler if self.config is not None else "rejection"

    def _run(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids, ignore_eos,
             sampler=None):
        prompt_ids = self._prompt_ids(prompt)
        self._check_length(len(prompt_ids), max_new_tokens)
        if stop and self.tokenizer is None:
            raise InputError("stop strings need a tokenizer")
        sampling = SamplingParams(float(temperature), int(top_k), float(top_p))
        rules = StopRules(max_new_tokens=max_new_tokens,
                          eos_token_ids=frozenset() if ignore_eos else self._eos_ids(),
                          stop_token_ids=frozenset(stop_token_ids or ()),
                          stop_strings=tuple([stop] if isinstance(stop, str) else (stop or ())),
                          tokenizer=self.tokenizer)
        generator = make_generator(seed, self.verifier.device)
        noise = make_noise(self._sampler(sampler), seed, sampling, output_vocab_size(self.target), self.verifier.device)
        stats = Stats()
        return decode(self.verifier, self.strategy, prompt_ids, sampling, rules, generator, stats, noise), stats

    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = 0, stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 sampler: str | None = None) -> GenerationOutput:
        """Generate up to max_new_tokens after `prompt` (a string or a list of token ids).
        temperature 0 = greedy. Returns the new tokens only, their text and statistics.
        sampler (temperature > 0): "rejection" (lossless rejection sampling) or "coupled" (Gumbel-max
        noise keyed by (seed, position): every strategy gives the same text for the same seed);
        None = the config's generation.sampler, else "rejection"."""
        steps, stats = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop,
                                 stop_token_ids, ignore_eos, sampler)
        new_ids: list[int] = []
        reason = "length"
        for run, finish in steps:
            new_ids.extend(run)
            reason = finish or reason
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        return GenerationOutput(text=text, token_ids=new_ids, stats=stats, finish_reason=reason)

    def stream(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int | None = 0, stop: str | Sequence[str] | None = None,
               stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
               sampler: str | None = None) -> Iterator[str]:
        """Yield the new text piece by piece, as each verify step accepts a run of tokens.
        The pieces join to the text `generate` returns with the same arguments."""
        if self.tokenizer is None:
            raise InputError("stream() yields text and needs a tokenizer; use generate() with token ids")
        steps, _ = self._run(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop,
                             stop_token_ids, ignore_eos, sampler)
        new_ids: list[int] = []
        shown = ""
        for run, _finish in steps:
            new_ids.extend(run)
            text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
            # hold back a trailing replacement char: a multi-byte character may be incomplete
            ready = text[:-1] if text.endswith("\ufffd") else text
            if len(ready) > len(shown) and ready.startswith(shown):
                yield ready[len(shown):]
                shown = ready
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        if text != shown and text.startswith(shown):
            yield text[len(shown):]


def _strategy_by_name(name: str, config: SpecConfig | None):
    """A strategy that needs no model of its own, by its registry name."""
    from .config import load_spec_config
    from .errors import ModelLoadError
    from .strategies import REGISTRY, build_strategy
    if name not in REGISTRY:
        raise InputError(f"unknown strategy {name!r}; strategies: {', '.join(REGISTRY)}")
    cfg = config if config is not None and config.strategy == name else load_spec_config(None, {"strategy": name})
    try:
        return build_strategy(cfg, None, None, None, None)
    except ModelLoadError as exc:
        raise InputError(f"strategy {name!r} needs a model or heads of its own ({exc}): build it with "
                         f"specdec.load({name!r}, ...) or pass a strategy object") from exc


def load(config: str = "autoregressive", /, **overrides) -> Speculator:
    """Build a Speculator from a shipped config name or a YAML path, with dotted overrides:
    specdec.load("draft_model", **{"target.path": "...", "draft.path": "..."})."""
    from .strategies import build_strategy
    cfg = load_spec_config(config, overrides)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.target.path is None:
        from .family.defaults import apply_default_paths
        apply_default_paths(cfg)
    target = load_model(cfg.target.path, "target", device, dtype)
    tokenizer = load_tokenizer(cfg.target.tokenizer or cfg.target.path, "target")
    strategy = build_strategy(cfg, target, tokenizer, device, dtype)
    return Speculator(target, tokenizer, strategy, config=cfg)
