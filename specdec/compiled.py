"""`compile: true`: the verify forward with static shapes, compiled once per bucket size.

gpt-fast's recipe on a stock Hugging Face model: the KV cache is one fixed-size buffer per layer
(`SlotLayer`), the forward's rows [pending token] + tree are padded to the next bucket size, and
the attention reads the whole buffer, the mask hiding empty slots, stale rejected rows and the
padding rows (whose KV lands after the real rows and is never committed). Every forward of a bucket
then has the same shapes, so `torch.compile` traces it once ("reduce-overhead" = CUDA graphs on a
GPU, inductor's default mode on CPU); masks and positions are built on the device each step."""
from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F

from .cache import new_static_cache
from .errors import IncompatibleModelsError
from .models import AttentionLayout, cache_keyword
from .tables import ShapeTables
from .tree import chain_masks, chain_position_ids, tree_masks, tree_position_ids

BUCKETS = (1, 2, 4, 8, 16, 32, 64)        # rows of a compiled forward (pending token + tree nodes, padded)
CAPACITY_STEP = 256                       # static caches are sized in multiples of this (fewer recompiles)
# Dynamo keeps one cache of compiled graphs per function (shared by every StaticForward): one entry per
# bucket, output_hidden_states and cache size. Past its limit (8 by default) it would silently run
# the rest eagerly, so the compiled call raises the limit for itself.
COMPILED_ATTENTION = ("sdpa", "eager")    # attention implementations the static forward runs with
RECOMPILE_LIMIT = 64
_LIMIT_KEY = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


def bucket_rows(rows: int, buckets: Sequence[int] = BUCKETS) -> int | None:
    """The smallest bucket that holds `rows` rows (None: larger than every bucket)."""
    return next((size for size in buckets if size >= rows), None)


def padded_parents(parents: Sequence[int], rows: int) -> tuple[int, ...]:
    """Parents of a forward padded to `rows`: each padding row hangs off row 0 (the pending token),
    so it sees the prefix, row 0 and itself (a valid softmax), and no real row sees it."""
    return tuple(parents) + (0,) * (rows - len(parents))


class StaticForward:
    """The target's forward over a fixed-size cache (`run`): compiled per bucket, eager for more
    rows than the largest bucket (a long prefill) and for the first write (which allocates). The
    cache is kept between calls while it is large enough, so compiled graphs (and CUDA graphs)
    stay valid. `compiled_rows`: the buckets this instance has run compiled. `tables`: where its
    masks' shape tables are kept (the verifier's)."""

    def __init__(self, model, layout: AttentionLayout, mode: str | None = None,
                 buckets: Sequence[int] = BUCKETS, tables: ShapeTables | None = None):
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        if impl not in COMPILED_ATTENTION:
            raise IncompatibleModelsError(
                f"compile: true runs the target with additive masks over a fixed-size cache, which "
                f"attn_implementation={impl!r} does not take (and inductor's CPU flex-attention kernel fails at "
                f"run time with torch {torch.__version__}): load the target with attn_implementation=\"sdpa\" "
                f"(or \"eager\"), or set compile=false")
        self.model = model
        self.cache_keyword = cache_keyword(model)     # looked up here, not in the traced forward
        self.layout = layout
        self.tables = tables if tables is not None else ShapeTables()
        self.buckets = tuple(sorted(buckets))
        self.mode = mode or ("reduce-overhead" if model.device.type == "cuda" else "default")
        self.cache = None
        self.compiled = torch.compile(self._model_forward, mode=self.mode, dynamic=False)
        self.compiled_rows: set[int] = set()

    def for_call(self) -> "StaticForward":
        """A StaticForward over a static cache of its own (for a call that overlaps another): the
        compiled function reads the cache from its instance, so the twin compiles its own."""
        twin = copy.copy(self)
        twin.cache = None
        twin.compiled = torch.compile(twin._model_forward, mode=self.mode, dynamic=False)
        twin.compiled_rows = set()
        return twin

    @property
    def capacity(self) -> int:
        return self.cache.layers[0].max_cache_len if self.cache is not None else 0

    def _model_forward(self, input_ids, position_ids, mask, output_hidden_states, logits_to_keep: int = 0):
        """The model's own forward, without its module hooks (what is compiled).
        output_hidden_states: False, or the hidden_states indices to record (verifier.hidden_request)."""
        return type(self.model).forward(self.model, input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                        **{self.cache_keyword: self.cache}, use_cache=True,
                                        output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep)

    def _call(self, forward, input_ids, position_ids, mask, output_hidden_states, logits_to_keep: int = 0):
        """model(...) through its __call__ with `forward` doing the work: the module's hooks (a
        benchmark's forward meter, say) run as usual, eagerly, outside the compiled graph."""
        saved = self.model.__dict__.get("forward")
        self.model.forward = lambda **kw: forward(kw["input_ids"], kw["position_ids"], kw["attention_mask"],
                                                  kw["output_hidden_states"], kw["logits_to_keep"])
        try:
            return self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                              output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep)
        finally:
            if saved is None:
                del self.model.forward
            else:
                self.model.forward = saved

    def start(self, needed: int) -> None:
        """A new sequence of up to `needed` cache slots (prompt + new tokens + the largest forward).
        The cache is reused when it is large enough (its stale entries are masked out)."""
        needed = max([needed, *self.buckets[-1:]])
        if self.cache is None or self.capacity < needed:
            capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
            self.cache = new_static_cache(self.model, capacity)

    def _grow(self, needed: int, prefix_len: int) -> None:
        """The fallback when a sequence outgrows the cache: a larger one, the prefix copied over
        (compiled graphs are traced again for the new size)."""
        old = self.cache
        self.cache = None
        self.start(needed)
        if old.layers[0].is_initialized:
            for layer, old_layer in zip(self.cache.layers, old.layers):
                if not layer.is_initialized:
                    layer.lazy_initialization(old_layer.keys[:, :, :1], old_layer.values[:, :, :1])
                layer.kv_buffer[:, :, :, :prefix_len] = old_layer.kv_buffer[:, :, :, :prefix_len]

    def run(self, input_ids: torch.Tensor, parents: Sequence[int] | None, prefix_len: int,
            output_hidden_states, last_logits_only: bool = False):
        """One forward of the rows `input_ids` [1, R] (tree `parents`, written after prefix_len
        committed entries; None: a prefill chunk, a chain of the R rows whose mask is computed with
        no table): compiled when R fits a bucket, padded to it; eager otherwise.
        Returns the model output; its rows beyond R are padding. output_hidden_states: False or
        the hidden_states indices to record. last_logits_only (a prefill, which reads no logits):
        an eager forward computes the lm_head on its last row only instead of a [R, V] block per
        prompt chunk; a compiled one (R <= the largest bucket) keeps every row, so prefills and
        verify steps share one graph per bucket."""
        rows = input_ids.shape[1]
        bucket = bucket_rows(rows, self.buckets)
        size = bucket or rows
        if prefix_len + size > self.capacity:
            self._grow(prefix_len + size + CAPACITY_STEP, prefix_len)
        if bucket is not None and bucket > rows:
            input_ids = F.pad(input_ids, (0, bucket - rows), value=0)          # [1, bucket]: padding rows
            parents = None if parents is None else padded_parents(parents, bucket)
        device = input_ids.device
        # row i sees the prefix, its ancestors among the rows and itself (within its layer type's
        # window); every other slot, filled or not, is hidden
        if parents is None:            # a prefill chunk: a chain (then padding rows), no table
            mask = chain_masks(self.layout, rows, size, prefix_len, self.model.dtype, device, capacity=self.capacity)
            positions = chain_position_ids(rows, size, prefix_len, device)                # [1, R]
        else:
            mask = tree_masks(self.layout, parents, prefix_len, self.model.dtype, device, capacity=self.capacity,
                              tables=self.tables)
            positions = tree_position_ids(parents, prefix_len, device, self.tables)       # [1, R]
        self.cache.write_start.fill_(prefix_len)
        if bucket is None or not self.cache.layers[0].is_initialized:   # the first write allocates: eager
            return self._call(self._model_forward, input_ids, positions, mask, output_hidden_states,
                              1 if last_logits_only else 0)
        self.compiled_rows.add(bucket)
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch._dynamo.config.patch(**{_LIMIT_KEY: max(RECOMPILE_LIMIT, getattr(torch._dynamo.config, _LIMIT_KEY))}):
            return self._call(self.compiled, input_ids, positions, mask, output_hidden_states)


_BACKEND_PROBLEMS: dict[str, str | None] = {}     # device -> why torch.compile fails there (None: it works)


def compile_problem(device: torch.device | str = "cpu") -> str | None:
    """Why torch.compile cannot run on `device` here (inductor needs a working C++ compiler and
    Python headers on CPU, Triton on a GPU), as a sentence; None when a tiny function compiles
    and runs. Checked once per device."""
    key = str(device)
    if key not in _BACKEND_PROBLEMS:
        try:
            x = torch.ones(4, device=device)
            torch.compile(lambda t: (t * 2).sum(), dynamic=False)(x).item()
            _BACKEND_PROBLEMS[key] = None
        except Exception as exc:  # noqa: BLE001 - reported as the reason
            first_line = next(iter(str(exc).strip().splitlines()), "")
            _BACKEND_PROBLEMS[key] = f"torch.compile (inductor) fails on {key}: {type(exc).__name__}: {first_line}"
    return _BACKEND_PROBLEMS[key]
