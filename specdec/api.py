"""The public API: specdec.Speculator(target, tokenizer, strategy); specdec.load(...) builds one from a
config (specdec/loading.py)."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from .attention_backend import avoid_cudnn_attention
from .row_linear import set_packing
from .arguments import as_int, check_flag, check_int, check_generation_args, check_text, check_token_ids
from .config import GenerationDefaults
from .coupled import make_noise
from .errors import InputError
from .batch import BatchOutput, Job, batch_output, decode_batch
from .loop import Decoding, _Clock, decode
from .processing import LogitsProcessing
from .models import context_length, output_vocab_size
from .sampling import SamplingParams, TorchRandom, make_generator, resolve_seed
from .stopping import StopRules
from .types import GenerationOutput, Stats
from .verifier import PREFILL_CHUNK, ROW_LINEAR, Verifier


class _Unset:
    """Default of generate()/stream()'s sampling arguments: take the value from the loaded config's
    `generation:` section (config.GenerationDefaults' defaults for a Speculator without a config)."""

    def __repr__(self) -> str:
        return "<config default>"


_UNSET = _Unset()


class Stream:
    """What Speculator.stream() returns: iterate it for the new text, piece by piece, as each verify
    step accepts a run of tokens. `.stats`, `.token_ids` (new tokens) and `.finish_reason` ("eos",
    "stop", "length"; None while running; "cancelled" once close()d before it finished) fill as it
    goes. Streams of one Speculator may be advanced in any order, from any threads: each holds its
    own KV cache and strategy state. close() (or leaving a `with` block, or dropping the stream)
    ends it early."""

    def __init__(self, speculator: "Speculator", steps: Iterator[tuple[list[int], str | None]], stats: Stats,
                 call: "_Call"):
        self._speculator = speculator
        self._steps = steps                 # the decode loop: (new tokens, finish reason or None) per step
        self._call = call                   # the verifier and strategy this call runs on
        self.stats = stats
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self._done = False
        self._shown = ""                    # text already yielded

    @property
    def text(self) -> str:
        """The new text so far (decoded whole; it may end in an incomplete character)."""
        return self._speculator._decode_text(self.token_ids)

    def _advance(self) -> list[int] | None:
        """Run one verify step: its accepted tokens, or None once generation has finished. Steps
        of all calls on one Speculator run one at a time (its lock): the target and the drafters
        are shared, and a step of one call never interleaves with a step of another."""
        if self._done:
            return None
        try:
            with self._speculator._serial():
                run, finish = next(self._steps)
        except StopIteration:
            self._end()
            return None
        except BaseException:
            self._end()
            raise
        self.token_ids.extend(run)
        if finish is not None:
            self.finish_reason = finish
            self._end()
        return run

    def _end(self) -> None:
        self._done = True
        with self._speculator._serial():        # the loop's cleanup may touch shared state too
            self._steps.close()
        self._speculator._release(self._call)

    def close(self) -> None:
        """Stop generating and give back what this call holds. A stream closed before it finished
        says so in finish_reason ("cancelled"); a finished one keeps its reason."""
        if not self._done:
            self.finish_reason = "cancelled"
            self._end()

    def __del__(self) -> None:
        # a stream dropped unfinished gives its verifier and strategy back for the next call
        try:
            if not self._done:
                self._speculator._release(self._call)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to give back to
            pass

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        while self._advance() is not None:
            # hold back a trailing replacement char: a multi-byte character may be incomplete
            text = self.text
            ready = text[:-1] if text.endswith("\ufffd") else text
            if len(ready) > len(self._shown) and ready.startswith(self._shown):
                piece, self._shown = ready[len(self._shown):], ready
                return piece
        text = self.text
        if len(text) > len(self._shown) and text.startswith(self._shown):
            piece, self._shown = text[len(self._shown):], text
            return piece
        raise StopIteration

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tree_rows_bound(strategy) -> int:
    """Rows of the largest verify forward to plan the KV cache for: the pending token + the
    strategy's node budget when it states one (else 64 nodes; a larger tree still works, the
    cache then grows)."""
    return 1 + max(64, int(strategy.max_nodes or 0))


# Test-only switch: False turns off what keeps concurrent calls apart (the step lock and the per-call
# verifier and strategy), so a test can show that its check catches the bug this guards against.
CONCURRENCY_GUARD = True


@dataclass
class _Request:
    """One prompt's checked arguments and what its decoding needs (Speculator._prepare)."""
    prompt_ids: list[int]
    sampling: SamplingParams
    rules: StopRules
    generator: torch.Generator
    noise: object
    processing: LogitsProcessing
    stats: Stats
    cache_scope: str | None = None

    def room(self, strategy) -> int:
        """Cache entries to plan for: prompt + new tokens + the largest forward (pending + tree)."""
        return len(self.prompt_ids) + self.rules.max_new_tokens + tree_rows_bound(strategy)


DEFAULT_BATCH_SIZE = 16      # rows at once when generate() is given a list and no batch_size


@dataclass
class _Call:
    """What one generate()/stream() call runs on: the Speculator's own verifier and strategy when
    no other call holds them (`own`), else copies with per-call state of their own."""
    verifier: Verifier
    strategy: object
    own: bool
    released: bool = False


log = logging.getLogger(__name__)
COMPILE_ON_CPU = "SPECDEC_COMPILE_ON_CPU"     # "1": compile on a CPU all the same (tests of the compiled path)


def compile_pays(device: torch.device) -> bool:
    """Whether `compile: true` is kept on `device`. On a CPU the compiled verify forward (static cache,
    inductor's C++ kernels, no CUDA graphs to save launches) is no faster than the eager one, and each
    tree size a call meets first costs seconds of compiling (benchmarks/results/compile/README.md),
    so there it is dropped with one line saying why, unless SPECDEC_COMPILE_ON_CPU=1 asks for it."""
    if device.type != "cpu" or os.environ.get(COMPILE_ON_CPU) == "1":
        return True
    log.warning("compile: true is not used on a CPU: the compiled verify forward is no faster than the eager "
                "one there, and compiling each new tree size takes seconds; the target runs eagerly "
                "(%s=1 compiles it anyway)", COMPILE_ON_CPU)
    return False


class Speculator:
    """Speculative generation with `strategy` on `target`. Output law = the target's own.

    Safe to share between threads: every call runs on a KV cache and a strategy state of its own
    (the first call on the Speculator's `verifier` and `strategy` objects, a call that overlaps it
    on per-call copies of them, which share the models and what a strategy learns across calls),
    and the steps of all calls run one at a time under one lock."""

    def __init__(self, target, tokenizer, strategy, *, config=None, compile: bool | None = None,
                 row_linear: int | None = None):
        from .strategies import Strategy, as_strategy
        if isinstance(strategy, str):
            strategy = _strategy_by_name(strategy, config)
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must follow specdec.strategies.Strategy (bind/reset/propose/observe), "
                            f"got {type(strategy).__name__}")
        self.target = target.eval()
        self.tokenizer = tokenizer
        if not (config is not None and config.cudnn_attention):
            avoid_cudnn_attention(self.target.device)
        set_packing(config.packed_linear if config is not None else True)    # before any twin is made
        # the strategy as a BaseStrategy (every hook the engine calls): the object itself, or for one written
        # against the bare Strategy protocol a view that adds the default hooks (its attributes read through)
        self.strategy = strategy = as_strategy(strategy)
        self.config = config
        self.profile = bool(config.profile) if config is not None else False   # exact time split on a GPU
        if compile is None:     # `compile: true` in the config: the verify forward compiled, static shapes
            compile = bool(config.compile) if config is not None else False
        compile = compile and compile_pays(self.target.device)
        prefill_chunk = int(config.prefill_chunk) if config is not None else PREFILL_CHUNK
        if row_linear is None:  # `row_linear: N` in the config (specdec.row_linear)
            row_linear = int(config.row_linear) if config is not None else ROW_LINEAR
        self.verifier = Verifier(self.target, compile=compile, prefill_chunk=prefill_chunk, row_linear=row_linear)
        self.context = context_length(self.target, tokenizer)
        self._step_lock = threading.RLock()     # one verify step at a time (re-entrant: a stream dropped mid-step)
        self._calls_lock = threading.RLock()    # who holds self.verifier / self.strategy
        self._own_in_use = False
        strategy.use_compiled_verifier(bool(compile))
        strategy.use_row_linear(self.verifier.row_linear)
        strategy.bind(self.target, tokenizer)

    # ------------------------------------------------------------------ per-call state
    def _acquire(self) -> _Call:
        """The verifier and strategy for a new call: the Speculator's own when free, else copies."""
        from .strategies import per_call
        if not CONCURRENCY_GUARD:
            return _Call(self.verifier, self.strategy, own=False)
        with self._calls_lock:
            if not self._own_in_use:
                self._own_in_use = True
                return _Call(self.verifier, self.strategy, own=True)
        with self._step_lock:               # copying reads state a running step may be writing
            return _Call(self.verifier.for_call(), per_call(self.strategy), own=False)

    def _serial(self):
        """The lock every verify step runs under (nothing with CONCURRENCY_GUARD off)."""
        return self._step_lock if CONCURRENCY_GUARD else contextlib.nullcontext()

    def _release(self, call: _Call) -> None:
        with self._calls_lock:
            if call.own and not call.released:
                self._own_in_use = False
            call.released = True

    # ------------------------------------------------------------------ inputs
    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("a text prompt needs a tokenizer: pass one to Speculator or give token ids")
            ids = self.tokenizer(check_text(prompt, "the prompt"))["input_ids"]
        elif isinstance(prompt, torch.Tensor) or hasattr(prompt, "__array__"):   # torch tensor / numpy array
            if prompt.ndim > 2:
                raise InputError(f"a prompt {type(prompt).__name__} of shape {tuple(prompt.shape)} is not supported: "
                                 f"give one sequence of ids, shape [n] or [1, n]")
            ids = prompt.reshape(-1).tolist()
            if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
                raise InputError(f"the prompt {type(prompt).__name__} has dtype {prompt.dtype}: token ids must be "
                                 f"integers")
        elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
            ids = check_token_ids(prompt, "prompt")
        else:
            raise InputError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InputError("the prompt is empty: give at least one token (a batch: at least one prompt)")
        vocab = self.target.get_input_embeddings().num_embeddings
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(f"prompt token id {bad[0]} is outside the model's vocabulary of {vocab} ids (0..{vocab - 1})")
        return ids

    def _check_length(self, n_prompt: int, max_new_tokens: int) -> None:
        if self.context is None:
            return
        if max_new_tokens >= self.context:
            fit = f": lower it to at most {self.context - n_prompt} for this {n_prompt}-token prompt" \
                if n_prompt < self.context else ""
            raise InputError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the model's "
                             f"context of {self.context} tokens (prompt + new tokens must fit){fit}")
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

    def _generation_args(self, given: dict) -> dict:
        """Explicit arguments win; the rest come from the config's generation section (or the
        built-in defaults); all are checked."""
        defaults = self.config.generation if self.config is not None else GenerationDefaults()
        return check_generation_args({name: getattr(defaults, name) if value is _UNSET else value
                                      for name, value in given.items()})

    # ------------------------------------------------------------------ generation
    def _prepare(self, prompt, stop_token_ids, ignore_eos, cache_scope, given: dict) -> "_Request":
        """Check one prompt and its arguments and build what its decoding needs."""
        args = self._generation_args(given)
        prompt_ids = self._prompt_ids(prompt)
        self._check_length(len(prompt_ids), args["max_new_tokens"])
        stop_ids = () if stop_token_ids is None else check_token_ids(
            [stop_token_ids] if as_int(stop_token_ids) is not None else stop_token_ids, "stop_token_ids")
        ignore_eos = check_flag(ignore_eos, "ignore_eos")
        if cache_scope is not None and not isinstance(cache_scope, str):
            raise InputError(f"cache_scope must be a string (or None for the configured scope), got "
                             f"{type(cache_scope).__name__}")
        if args["stop"] and self.tokenizer is None:
            raise InputError("stop strings need a tokenizer")
        sampling = SamplingParams(args["temperature"], args["top_k"], args["top_p"])
        rules = StopRules(max_new_tokens=args["max_new_tokens"],
                          eos_token_ids=frozenset() if ignore_eos else self._eos_ids(),
                          stop_token_ids=frozenset(stop_ids), stop_strings=args["stop"], tokenizer=self.tokenizer)
        seed = resolve_seed(args["seed"])     # once: the generator and the coupled noise share it
        generator = make_generator(seed, self.verifier.device)
        noise = make_noise(args["sampler"], seed, sampling, output_vocab_size(self.target), self.verifier.device)
        # built before the call starts: an unsupported generation_config fails here, not mid-stream
        processing = LogitsProcessing.for_generation(self.target, prompt_ids, args["max_new_tokens"])
        return _Request(prompt_ids, sampling, rules, generator, noise, processing,
                        Stats(seed=None if sampling.greedy else seed), cache_scope)

    def _open(self, prompt, stop_token_ids, ignore_eos, cache_scope=None, **given) -> Stream:
        """Check every argument, then start a call on a verifier and strategy of its own."""
        prompts = self._batch_of(prompt)
        if prompts is not None and len(prompts) > 1:
            raise InputError("stream() takes one prompt; give a list of prompts to generate() to run them as a "
                             "batch")
        if prompts is not None:                 # a batch of one
            prompt = prompts[0]
        request = self._prepare(prompt, stop_token_ids, ignore_eos, cache_scope, given)
        call = self._acquire()
        # the target's KV cache, sized once: prompt + new tokens + the largest forward (pending + tree)
        call.verifier.reserve(request.room(call.strategy))
        steps = decode(call.verifier, call.strategy, request.prompt_ids, request.sampling, request.rules,
                       request.generator, request.stats, request.noise, request.processing, self.profile,
                       request.cache_scope)
        return Stream(self, steps, request.stats, call)

    # ------------------------------------------------------------------ batches
    @staticmethod
    def _batch_of(prompt) -> list | None:
        """The prompts of a batch call (a list of strings or of id lists, or a [B, n] tensor with
        B > 1), else None (one prompt)."""
        if isinstance(prompt, torch.Tensor) or hasattr(prompt, "__array__"):
            return list(prompt) if getattr(prompt, "ndim", 1) == 2 and prompt.shape[0] > 1 else None
        if isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(p, str) or (isinstance(p, (list, tuple)) or hasattr(p, "__array__")) for p in prompt):
            return list(prompt)
        return None

    def _generate_batch(self, prompts: list, batch_size, stop_token_ids, ignore_eos, cache_scope, on_output,
                        progress: bool, given: dict) -> BatchOutput:
        per_row = {"max_new_tokens": False, "seed": False, "stop": False}
        for name in per_row:
            value = given[name]
            if name == "stop":
                rowwise = isinstance(value, (list, tuple)) and any(isinstance(v, (list, tuple)) or v is None
                                                                   for v in value)
            else:
                rowwise = isinstance(value, (list, tuple))
            if rowwise and len(value) != len(prompts):
                raise InputError(f"{name} holds {len(value)} values for {len(prompts)} prompts: give one per prompt, "
                                 f"or one value for all")
            per_row[name] = rowwise
        if batch_size is None:
            batch_size = min(len(prompts), DEFAULT_BATCH_SIZE)
        batch_size = check_int(batch_size, "batch_size", 1)
        requests = []
        for i, prompt in enumerate(prompts):
            row_args = {name: (value[i] if per_row.get(name) else value) for name, value in given.items()}
            try:
                requests.append(self._prepare(prompt, stop_token_ids, ignore_eos, cache_scope, row_args))
            except InputError as exc:
                raise InputError(f"prompt {i}: {exc}") from None
        strategy = self.strategy
        jobs = [Job(i, r.prompt_ids, self._row_start(r), r.room(strategy), r.stats) for i, r in enumerate(requests)]
        clock = _Clock(self.verifier.device, self.profile)
        token_ids: list[list[int]] = [[] for _ in prompts]
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        steps = decode_batch(self.verifier, strategy, jobs, batch_size, clock)
        start, forwards = clock(), 0
        with tqdm(total=len(prompts), unit="prompt", disable=not progress, file=sys.stderr) as bar:
            while True:
                with self._serial():
                    step = next(steps, None)
                if step is None:
                    break
                forwards += 1
                for index, run, reason in step:
                    token_ids[index].extend(run)
                    if reason is not None:
                        outputs[index] = GenerationOutput(text=self._decode_text(token_ids[index]),
                                                          token_ids=token_ids[index], stats=requests[index].stats,
                                                          finish_reason=reason)
                        bar.update(1)
                        if on_output is not None:
                            on_output(index, outputs[index])
        return batch_output(outputs, clock() - start, forwards)

    def batch_job(self, index: int, prompt, stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                  cache_scope: str | None = None, **given) -> Job:
        """One row for a batch that runs elsewhere (specdec.batch.decode_batch fed from a live queue, as
        specdec.serve's engine does): `prompt` and the generation arguments checked as generate() checks
        them (an InputError names the bad one), arguments not given taking the config's values. Its
        rows run on per-call copies of the strategy, the Speculator's verifier lends the model."""
        given = {name: given.pop(name, _UNSET) for name in GenerationDefaults.__dataclass_fields__} | given
        unknown = set(given) - set(GenerationDefaults.__dataclass_fields__)
        if unknown:
            raise TypeError(f"batch_job() got unexpected argument(s) {sorted(unknown)}")
        request = self._prepare(prompt, stop_token_ids, ignore_eos, cache_scope, given)
        return Job(index, request.prompt_ids, self._row_start(request), request.room(self.strategy), request.stats)

    def _row_start(self, request: "_Request"):
        """How a batch row starts: a Decoding on a per-call copy of the strategy."""
        from .strategies import per_call

        def start(prompt_hidden, stats: Stats, prompt_top_ids=None) -> Decoding:
            clock = _Clock(self.verifier.device, self.profile)
            stats.profiled = clock.exact
            return Decoding(per_call(self.strategy), request.prompt_ids, prompt_hidden, request.sampling,
                            request.rules, TorchRandom(request.generator), stats, request.noise, request.processing,
                            clock, clock() - stats.prefill_time_s, request.cache_scope,
                            prompt_top_ids=prompt_top_ids)
        return start

    def _decode_text(self, token_ids: list[int]) -> str:
        """The text of new tokens, as every output reports it (special tokens skipped)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def generate(self, prompt, max_new_tokens: int = _UNSET, temperature: float = _UNSET, top_k: int = _UNSET,
                 top_p: float = _UNSET, seed: int | None = _UNSET, stop: str | Sequence[str] | None = _UNSET,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 sampler: str = _UNSET, batch_size: int | None = None,
                 cache_scope: str | None = None, on_output=None, progress: bool = False) -> GenerationOutput | BatchOutput:
        """Generate up to max_new_tokens after `prompt` (a string or a list of token ids).
        temperature 0 = greedy. Arguments not given take the loaded config's `generation:` values
        (128, 0.0, 0, 1.0, None, None, "rejection" without a config). seed=None draws a fresh
        seed per call, reported in out.stats.seed: pass it back as seed= to get the same sample again
        (greedy ignores the seed). Returns the new tokens only, their
        text and statistics. sampler (temperature > 0): "rejection" (lossless rejection sampling) or
        "coupled" (Gumbel-max noise keyed by (seed, position): every strategy gives the same text for
        the same seed).
        A list of prompts (strings or id lists, any lengths) runs as a batch: one target forward per
        step over up to `batch_size` rows (default: all, at most 16), a finished row's slot taken by the
        next prompt; it returns one output per prompt, in order (a BatchOutput: a list with the
        batch's totals in `.stats`). max_new_tokens and seed may then be lists (one per prompt), and
        stop a list of lists. on_output(index, output) is called as each prompt finishes (in the
        order they finish); progress=True shows a progress bar over the prompts."""
        prompts = self._batch_of(prompt)
        if prompts is not None:
            return self._generate_batch(prompts, batch_size, stop_token_ids, ignore_eos, cache_scope, on_output,
                                        progress,
                                        dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                             top_p=top_p, seed=seed, stop=stop, sampler=sampler))
        stream = self._open(prompt, stop_token_ids, ignore_eos, cache_scope, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop,
                            sampler=sampler)
        while stream._advance() is not None:
            pass
        return GenerationOutput(text=stream.text, token_ids=stream.token_ids, stats=stream.stats,
                                finish_reason=stream.finish_reason or "length")

    def stream(self, prompt, max_new_tokens: int = _UNSET, temperature: float = _UNSET, top_k: int = _UNSET,
               top_p: float = _UNSET, seed: int | None = _UNSET, stop: str | Sequence[str] | None = _UNSET,
               stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
               sampler: str = _UNSET, cache_scope: str | None = None) -> Stream:
        """Yield the new text piece by piece, as each verify step accepts a run of tokens. The
        pieces join to the text `generate` returns with the same arguments; the returned Stream's
        `.stats` and `.finish_reason` fill as it goes."""
        if self.tokenizer is None:
            raise InputError("stream() yields text and needs a tokenizer; use generate() with token ids")
        return self._open(prompt, stop_token_ids, ignore_eos, cache_scope, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop,
                            sampler=sampler)


def _strategy_by_name(name: str, config):
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
