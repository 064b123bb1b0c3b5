"""layer_skip: the target drafts with itself minus a set of skipped attention and MLP sublayers (Draft & Verify,
Zhang et al. 2023; SWIFT, Xia et al. 2025), then the whole target verifies.

The drafter is a *view* of the target (skip_view), built as early_exit's is (early_exit.view_with_layers): a
shallow copy of the model object whose decoder list holds the target's own layer modules, except that a layer
with a skipped sublayer is a shallow copy of itself whose attention (or MLP) child is a stand-in giving zeros.
The layer adds that sublayer's output to its residual stream, so a skipped sublayer's branch contributes
nothing (exactly so where the output is added straight, or through an RMS norm: Llama, Qwen, Mistral, GPT-2,
GPT-NeoX, Gemma). No weight is copied and the target, its modules and its config are never changed (threads
may share the model). `LayerSkip` is a `DraftModel` whose draft is the view, so chains, trees, batches, the
coupled sampler, adaptive length and the target's logits processing come from strategies/draft_model.py.

The draft's KV cache. The view keeps a cache of its own, as a draft model does: its entries differ from the
target's (a layer's input differs once an earlier sublayer is skipped), so none of it may reach the verify,
and none does (the verifier reads the target's cache only; tests/test_layer_skip.py poisons the draft's cache
and still gets identity). Hugging Face derives positions and masks from the cache's length as its layer 0
reports it (`cache.get_seq_length()`), and specdec's commits move every layer's entries together: so a skipped
attention still writes one placeholder entry (zeros, of the shapes its real attention writes) per token into
its own layer's cache, computing nothing. Every layer of the draft cache then holds exactly one entry per
token the draft has seen, whatever is skipped (layer 0 included); the placeholders are never read, since the
skipped attention reads nothing.

`auto` (SWIFT's on-the-fly choice): the set is chosen while generating. Every `every` steps (and at the first
step of a call, on the prompt's tail) the current set and `candidates` neighbours of it (sets that swap one
skipped sublayer for one run sublayer, drawn by a seeded generator: SWIFT's random search, one swap at a time)
are scored: the number of the last `window` committed tokens that the set's teacher-forced draft predicts
greedily, each guess reading at least `context` tokens before the window (one forward per set, no cache).
The best set drafts from then on (the first of equals, the current set listed first); a change rebuilds the
draft cache from the committed text at the next proposal. The set depends on the committed text only, so
each draft distribution is still a function of the context, and the verdicts stay lossless. The number of skipped sublayers stays what the
start set has: `skip_fraction` of the 2L sublayers, or the size of the set given.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Sequence, Tuple

import torch
from torch import nn
from transformers.cache_utils import Cache

from specdec.cache import new_cache
from specdec.config import setting
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.models import cache_kwargs, shallow_module
from specdec.tree import CandidateTree, host_to_device
from specdec.types import DecodeState

from .base import ExpectedCall
from .draft_model import DraftModel, ViewDraftConfig
from .layer_views import decoder_layers, num_layers, probe_forward, view_with_layers

LOG = logging.getLogger(__name__)

ATTENTION, MLP = "attention", "mlp"
Sublayer = Tuple[str, int]               # (ATTENTION or MLP, decoder layer index)
SkipSet = FrozenSet[Sublayer]
MAX_VIEWS = 64                           # views a Skipper keeps (the oldest go first): module objects, no weights
# the names decoder layers give their attention and MLP children (Llama, Qwen, Mistral, Gemma: self_attn and mlp;
# GPT-2: attn; GPT-NeoX: attention; Falcon: self_attention; some MoE layers: feed_forward, ffn)
CHILD_NAMES = {ATTENTION: ("self_attn", "attn", "attention", "self_attention"),
               MLP: ("mlp", "feed_forward", "ffn")}


@dataclass
class LayerSkipConfig(ViewDraftConfig):
    """The `layer_skip:` section. The drafting settings mean what the `draft:` section's do."""
    attention: Optional[List[int]] = setting(None, item_min=0)   # decoder layers whose attention the draft skips
    mlp: Optional[List[int]] = setting(None, item_min=0)         # decoder layers whose MLP the draft skips
    auto: bool = False                      # choose the set while generating (SWIFT); attention / mlp, if given,
    #                                         are where the search starts; each row of generate(list) then
    #                                         drafts alone (rows' sets differ)
    skip_fraction: float = setting(0.5, above=0.0, max=0.95)   # auto without a start set: the share of the 2L
    #                                         sublayers skipped
    window: int = setting(32, min=1)        # auto: a set's score is how many of the last `window` tokens its
    #                                         teacher-forced draft predicts
    context: int = setting(32, min=0)       # auto: tokens each scoring forward reads before the window
    every: int = setting(16, min=1)         # auto: steps between searches
    candidates: int = setting(4, min=0)     # auto: neighbours of the current set scored per search
    seed: int = setting(0, min=0)           # auto: the search's random generator (per call)


CONFIG_SECTIONS = {"layer_skip": LayerSkipConfig}


def skip_set(attention: Sequence[int] | None = None, mlp: Sequence[int] | None = None) -> SkipSet:
    """The set skipping the attention of layers `attention` and the MLP of layers `mlp`."""
    return frozenset([(ATTENTION, int(i)) for i in attention or ()] + [(MLP, int(i)) for i in mlp or ()])


def describe(skipped: SkipSet) -> str:
    """'attention [..] mlp [..]': the set as the config writes it."""
    return " ".join(f"{kind} {sorted(i for k, i in skipped if k == kind)}" for kind in (ATTENTION, MLP))


# ---------------------------------------------------------------------- the stand-ins
class SkippedAttention(nn.Module):
    """Stands in for a decoder layer's attention: outputs zeros shaped as its input (its residual branch adds
    nothing), and writes one placeholder entry per token into its layer's cache, so every layer of the
    draft cache keeps the length Hugging Face reads from layer 0. Reads and computes nothing else."""

    def __init__(self, layer_idx: int, key_shape: tuple[int, int], value_shape: tuple[int, int], outputs: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.key_shape, self.value_shape = key_shape, value_shape    # (heads, dim) of one token's entry
        self.outputs = outputs               # the real attention's tuple length: (output, weights, ...)

    def forward(self, *args, **kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]      # [B, T, H]
        cache = next((value for value in (*args[1:], *kwargs.values()) if isinstance(value, Cache)), None)
        if cache is not None:
            batch, tokens = hidden.shape[:2]
            cache.update(hidden.new_zeros(batch, self.key_shape[0], tokens, self.key_shape[1]),
                         hidden.new_zeros(batch, self.value_shape[0], tokens, self.value_shape[1]), self.layer_idx)
        return (torch.zeros_like(hidden),) + (None,) * (self.outputs - 1)


class SkippedMLP(nn.Module):
    """Stands in for a decoder layer's MLP: zeros shaped as its input (its residual branch adds nothing)."""

    def forward(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return torch.zeros_like(hidden)


# ---------------------------------------------------------------------- the view
class Skipper:
    """The target's decoder layers and what a view skipping some of their sublayers needs: each layer's
    attention and MLP child names, the shapes of one token's KV entry per layer, the attention's output
    arity (probed once with one forward of the target). Refuses an architecture whose layers or sublayers
    cannot be run apart. view(skipped) gives the view, built once per set."""

    def __init__(self, target):
        self.target = target
        self.count = num_layers(target)
        self.layers = list(target.get_submodule(decoder_layers(target, "layer_skip")))
        self.children = [{kind: next((name for name in names if name in layer._modules), None)
                          for kind, names in CHILD_NAMES.items()} for layer in self.layers]
        self.key_shapes, self.value_shapes, self.outputs = self._probe()
        self.views: dict[SkipSet, nn.Module] = {}
        self.sublayer_parameters = {(kind, i): sum(p.numel() for p in self.layers[i]._modules[name].parameters())
                           for i, names in enumerate(self.children) for kind, name in names.items() if name}
        self.layer_parameters = sum(p.numel() for layer in self.layers for p in layer.parameters())

    def sublayers(self) -> list[Sublayer]:
        """Every sublayer that can be skipped, attention then MLP per layer, layer by layer."""
        return [(kind, i) for i in range(self.count) for kind in (ATTENTION, MLP) if self.children[i][kind]]

    def check(self, skipped: SkipSet) -> None:
        """Refuse a set with a layer outside 0 .. L - 1, a sublayer this architecture has not, or that
        skips every sublayer or none."""
        outside = sorted(i for _, i in skipped if not 0 <= i < self.count)
        if outside:
            raise ConfigError(f"layer_skip: layer {outside[0]} is outside 0 .. {self.count - 1} (the target has "
                              f"{self.count} decoder layers); give layer indices in that range")
        for kind, i in sorted(skipped):
            if not self.children[i][kind]:
                raise IncompatibleModelsError(
                    f"layer_skip: decoder layer {i} of the target ({type(self.target).__name__}) has no {kind} child "
                    f"(its children: {', '.join(self.layers[i]._modules)}; looked for "
                    f"{', '.join(CHILD_NAMES[kind])}), so its {kind} cannot be skipped; use another strategy")
        if not skipped:
            raise ConfigError("layer_skip: the set skips nothing (the draft would be the whole target); give "
                              "layer_skip.attention and/or layer_skip.mlp, or layer_skip.auto=true")
        if set(self.sublayers()) <= skipped:
            raise ConfigError(f"layer_skip: the set skips every sublayer of all {self.count} layers (the draft would "
                              f"read no context); keep at least one")

    def view(self, skipped: SkipSet) -> nn.Module:
        """The target minus the sublayers `skipped`, as a causal LM of its own (a Hugging Face model object)."""
        view = self.views.get(skipped)
        if view is None:
            self.check(skipped)
            view = self._build(skipped)
            while len(self.views) >= MAX_VIEWS:      # auto's search meets new sets for as long as it runs
                self.views.pop(next(iter(self.views)), None)
            self.views[skipped] = view
        return view

    def draft_cost(self, skipped: SkipSet) -> float:
        """The share of the decoder layers' parameters a view skipping `skipped` still runs: a guess at its
        forward's time over the target's."""
        return 1.0 - sum(self.sublayer_parameters[sublayer] for sublayer in skipped) / self.layer_parameters

    def _build(self, skipped: SkipSet) -> nn.Module:
        layers = []
        for i, layer in enumerate(self.layers):
            kinds = [kind for kind in (ATTENTION, MLP) if (kind, i) in skipped]
            if kinds:
                layer = shallow_module(layer)          # a copy whose children dict is its own
                for kind in kinds:
                    real = layer._modules[self.children[i][kind]]
                    layer._modules[self.children[i][kind]] = (
                        SkippedMLP() if kind == MLP else
                        SkippedAttention(i if getattr(real, "layer_idx", None) is None else real.layer_idx,
                                         self.key_shapes[i], self.value_shapes[i], self.outputs[i]))
            layers.append(layer)
        view = view_with_layers(self.target, layers)
        self._check_runs_apart(view, skipped)
        return view.eval()

    @torch.inference_mode()
    def _probe(self):
        """One forward of the target over one token, with a cache: each layer's KV entry shapes and each
        attention's output arity; refused where a sublayer's output is not what a stand-in can give."""
        shapes, outputs, bad = {}, {}, []

        def seen(i, kind):
            def hook(module, args, kwargs, output):
                hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                first = output[0] if kind == ATTENTION and isinstance(output, tuple) else output
                if not isinstance(first, torch.Tensor) or first.shape != hidden.shape:
                    bad.append(f"layer {i}'s {kind} gives {type(output).__name__}, not its input's shape")
                if kind == ATTENTION:
                    outputs[i] = len(output) if isinstance(output, tuple) else 0
            return hook

        handles = [self.layers[i]._modules[name].register_forward_hook(seen(i, kind), with_kwargs=True)
                   for i, names in enumerate(self.children) for kind, name in names.items() if name]
        cache = new_cache(self.target, "target")
        try:
            ids = torch.zeros(1, 1, dtype=torch.long, device=next(self.target.parameters()).device)
            self.target(input_ids=ids, use_cache=True, **cache_kwargs(self.target, cache))
        finally:
            for handle in handles:
                handle.remove()
        for i, layer in enumerate(cache.layers[: self.count]):
            if getattr(layer, "keys", None) is None or layer.keys.shape[-2] != 1:
                bad.append(f"layer {i} keeps no KV entry of its own")
                continue
            shapes[i] = ((layer.keys.shape[1], layer.keys.shape[3]), (layer.values.shape[1], layer.values.shape[3]))
        if any(n == 0 for n in outputs.values()):
            bad.append("an attention returns a bare tensor, not (output, weights)")
        if bad:
            raise IncompatibleModelsError(f"layer_skip: the target ({type(self.target).__name__}) cannot skip its "
                                          f"sublayers apart: {bad[0]}; use another strategy")
        return ([shapes[i][0] for i in range(self.count)], [shapes[i][1] for i in range(self.count)],
                [outputs.get(i, 2) for i in range(self.count)])

    @torch.inference_mode()
    def _check_runs_apart(self, view, skipped: SkipSet) -> None:
        """One forward of the view over two tokens with a cache: every sublayer not skipped runs once, no
        skipped one runs, and every layer's cache holds two entries."""
        ran: list[Sublayer] = []
        handles = [self.layers[i]._modules[name].register_forward_pre_hook(
            lambda module, args, sublayer=(kind, i): ran.append(sublayer))
            for i, names in enumerate(self.children) for kind, name in names.items() if name]
        cache = new_cache(view)
        what = f"layer_skip: the target ({type(self.target).__name__}) cannot run with {describe(skipped)} skipped"
        try:
            probe_forward(view, what, 2, use_cache=True, **cache_kwargs(view, cache))
        finally:
            for handle in handles:
                handle.remove()
        expected = [sublayer for sublayer in self.sublayers() if sublayer not in skipped]
        if sorted(ran) != sorted(expected):
            raise IncompatibleModelsError(f"{what}: a forward of the view ran {sorted(ran)}, not {sorted(expected)}; "
                                          f"use another strategy")
        lengths = [layer.keys.shape[-2] if getattr(layer, "keys", None) is not None else 0 for layer in cache.layers]
        if any(length != 2 for length in lengths):
            raise IncompatibleModelsError(f"{what}: its cache's layers hold {lengths} entries after two tokens, not 2 "
                                          f"each; use another strategy")


# ---------------------------------------------------------------------- SWIFT's choice
@torch.inference_mode()
def teacher_forced_hits(view, token_ids: Sequence[int], window: int, context: int) -> int:
    """How many of the last `window` tokens of `token_ids` the view's greedy guess from the tokens before
    each predicts, every guess reading the `context` tokens before the window too: one forward, no cache,
    at the tokens' own positions."""
    window = min(window, len(token_ids) - 1)
    if window <= 0:
        return 0
    end = len(token_ids) - 1                                   # the last token is only predicted
    start = max(0, end - window - context)
    device = next(view.parameters()).device
    ids = host_to_device(token_ids[start:end], device)[None]                      # [1, T]
    positions = torch.arange(start, end, device=device)[None]                     # [1, T]
    logits = view(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=window).logits[0]   # [W, V]
    truth = host_to_device(token_ids[-window:], device)                           # [W]
    return int((logits.argmax(dim=-1) == truth).sum())


def choose(views: Sequence[nn.Module], token_ids: Sequence[int], window: int, context: int) -> tuple[int, list[int]]:
    """(index of the best view, every view's hits): the view whose teacher-forced draft predicts the most of
    the last `window` tokens (teacher_forced_hits); the first of equals."""
    hits = [teacher_forced_hits(view, token_ids, window, context) for view in views]
    return hits.index(max(hits)), hits


def neighbours(current: SkipSet, sublayers: Sequence[Sublayer], count: int, rng: random.Random) -> list[SkipSet]:
    """Up to `count` distinct sets, each `current` with one skipped sublayer run again and one run sublayer
    skipped instead, drawn by `rng`."""
    skipped = sorted(current)
    kept = [sublayer for sublayer in sublayers if sublayer not in current]
    swaps = [(out, into) for out in skipped for into in kept]
    return [frozenset(current - {out} | {into}) for out, into in rng.sample(swaps, min(count, len(swaps)))]


def start_set(sublayers: Sequence[Sublayer], count: int, skip_fraction: float) -> SkipSet:
    """auto's first guess when no set is given: round(skip_fraction * sublayers) of them, from the layer before
    the last downwards (MLP, then attention), then the last layer's, layer 0's last: the upper-middle layers are
    where skipping costs least in SWIFT's and Draft & Verify's searches. The search then moves it."""
    size = min(max(1, round(skip_fraction * len(sublayers))), len(sublayers) - 1)
    order = [layer for layer in range(count - 2, 0, -1)] + [count - 1, 0]
    ranked = [(kind, layer) for layer in order for kind in (MLP, ATTENTION) if (kind, layer) in sublayers]
    return frozenset(ranked[:size])


# ---------------------------------------------------------------------- the strategy
class LayerSkip(DraftModel):
    """A DraftModel whose draft is the target minus a set of skipped sublayers (Skipper.view), made at bind;
    with auto, the set is chosen while generating (module docstring)."""
    name = "layer_skip"

    def __init__(self, attention: Sequence[int] | None = None, mlp: Sequence[int] | None = None, *,
                 auto: bool = LayerSkipConfig.auto, skip_fraction: float = LayerSkipConfig.skip_fraction,
                 window: int = LayerSkipConfig.window, context: int = LayerSkipConfig.context,
                 every: int = LayerSkipConfig.every, candidates: int = LayerSkipConfig.candidates,
                 seed: int = LayerSkipConfig.seed, num_tokens: int = LayerSkipConfig.num_tokens,
                 branching: List[int] | None = LayerSkipConfig.branching, max_nodes: int = LayerSkipConfig.max_nodes,
                 adaptive: bool = LayerSkipConfig.adaptive, min_tokens: int = LayerSkipConfig.min_tokens,
                 max_tokens: int = LayerSkipConfig.max_tokens, draft_cost: float | None = LayerSkipConfig.draft_cost,
                 min_confidence: float = LayerSkipConfig.min_confidence,
                 batch_rows: bool = LayerSkipConfig.batch_rows):
        super().__init__(None, num_tokens=num_tokens, branching=branching, max_nodes=max_nodes, adaptive=adaptive,
                         min_tokens=min_tokens, max_tokens=max_tokens, draft_cost=draft_cost or 0.0,
                         min_confidence=min_confidence, batch_rows=batch_rows,
                         lean_forward=False)   # its view of the target keeps the model's own forward
        if not 0.0 < skip_fraction < 1.0:
            raise ConfigError(f"layer_skip.skip_fraction must lie strictly between 0 and 1, got {skip_fraction}")
        if min(int(window), int(every)) < 1 or min(int(context), int(candidates)) < 0:
            raise ConfigError(f"layer_skip: window and every must be >= 1, context and candidates >= 0; got window "
                              f"{window}, every {every}, context {context}, candidates {candidates}")
        self.given = skip_set(attention, mlp)
        if not auto and not self.given:
            raise ConfigError("layer_skip: no sublayer to skip; give layer_skip.attention and/or layer_skip.mlp "
                              "(layer indices), or layer_skip.auto=true")
        self.auto = bool(auto)
        self.skip_fraction, self.window, self.context = float(skip_fraction), int(window), int(context)
        self.every, self.candidates, self.seed = int(every), int(candidates), int(seed)
        self.given_draft_cost = draft_cost
        self.skipper: Skipper | None = None
        self.start: SkipSet = self.given
        self.skipped: SkipSet = self.given        # the set drafting now

    def bind(self, target, tokenizer) -> None:
        self.skipper = Skipper(target)
        if self.auto and not self.given:
            self.start = start_set(self.skipper.sublayers(), self.skipper.count, self.skip_fraction)
        self._draft_with(self.start)
        super().bind(target, tokenizer)

    def reset(self, state: DecodeState) -> None:
        if self.auto:                 # every call starts from the start set and searches at its first step
            self._draft_with(self.start)
            self.rng = random.Random(self.seed)
            self.steps_to_search = 0
        super().reset(state)

    def propose(self, state: DecodeState) -> CandidateTree:
        if self.auto:
            self.steps_to_search -= 1
            if self.steps_to_search < 0:
                self._search(state.token_ids)
                self.steps_to_search = self.every - 1
        return super().propose(state)

    def expected_call(self, state: DecodeState) -> ExpectedCall | None:
        """At best, every token of its path kept, at the draft cost of the set it drafts with: a bound, not an
        expectation. Its acceptance cannot be read off the target's own forwards (a skipped sublayer changes
        the input of every layer after it), but a call whose every token is kept and still loses to lookup
        alone loses whatever it drafts, so auto need not call it to find out. The search of `auto` costs on
        top of this, which keeps the bound a bound."""
        if self.skipper is None:
            return None
        length = self.draft_depth(state)
        return ExpectedCall((1.0,) * length, self.draft_cost * length) if length > 0 else None

    def batch_drafter(self):
        """Rows of a batch draft together when they share one set: always, unless auto chooses each row's."""
        return None if self.auto else super().batch_drafter()

    # ------------------------------------------------------------------ the set
    def _draft_with(self, skipped: SkipSet) -> None:
        self.use_draft(self.skipper.view(skipped))
        self.skipped = skipped
        if self.given_draft_cost is None:
            self.draft_cost = self.skipper.draft_cost(skipped)

    def _search(self, token_ids: list[int]) -> None:
        """Score the current set and `candidates` neighbours of it on the committed text; draft with the best.
        A change drops the draft cache (its entries were made by another set): the next proposal refeeds."""
        sets = [self.skipped] + neighbours(self.skipped, self.skipper.sublayers(), self.candidates, self.rng)
        best, hits = choose([self.skipper.view(s) for s in sets], token_ids, self.window, self.context)
        if sets[best] != self.skipped:
            LOG.debug("layer_skip: %s (%d of the last %d tokens) replaces %s (%d)", describe(sets[best]), hits[best],
                      min(self.window, len(token_ids) - 1), describe(self.skipped), hits[0])
            self._draft_with(sets[best])
            self.cache = new_cache(self.draft)
            self.cached = 0
            self.tail = None


def from_config(cfg, target, tokenizer, device, dtype) -> LayerSkip:
    s = cfg.layer_skip
    return LayerSkip(s.attention, s.mlp, auto=s.auto, skip_fraction=s.skip_fraction, window=s.window,
                     context=s.context, every=s.every, candidates=s.candidates, seed=s.seed, num_tokens=s.num_tokens,
                     branching=list(s.branching) if s.branching else None, max_nodes=s.max_nodes, adaptive=s.adaptive,
                     min_tokens=s.min_tokens, max_tokens=s.max_tokens, draft_cost=s.draft_cost,
                     min_confidence=s.min_confidence, batch_rows=s.batch_rows)
