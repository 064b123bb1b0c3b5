"""The verifier: one forward of the unmodified target over [pending token] + tree, on top of its
KV cache, then the commit of the accepted path. It never knows which strategy proposed the tree.
With compile=True the forward runs over a fixed-size cache with static shapes, compiled per bucket
size (specdec.compiled).

Memory on long prompts: the prefill feeds the prompt in chunks of `prefill_chunk` tokens (peak
activations bounded by the chunk, not the prompt) and computes the lm_head on the last row only;
target features come from the layers asked for alone (`hidden_request`), never from a tuple of
every layer's hidden states."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from .cache import LinearAttentionCacheLayerMixin, commit_rows, new_cache
from .compiled import StaticForward, bucket_rows, padded_parents
from .errors import IncompatibleModelsError, StrategyError
from .models import attention_layout, cache_kwargs
from .row_linear import row_twin, runs_packed
from .tables import ShapeTables
from .tree import CandidateTree, LowerRun, tree_masks, tree_position_ids, with_pending_root, host_to_device


@dataclass
class TreeOutput:
    logits: torch.Tensor               # [1 + N, V]: row 0 = pending token, row i + 1 = tree node i
    hidden: torch.Tensor | None        # [1 + N, F] target features (see `features`), when asked
    shape: tuple[int, ...] | None = None   # the parents whose table (tree.tree_shape, in Verifier.tables) the
    #   forward's mask came from (padded, compiled), so the commit takes its path index from the same table;
    #   None: a chain


@dataclass
class Prefilled:
    """What a prefill returns: the features of the prefilled tokens [P, F] (with feature_layers) and
    the target's top-k next tokens after each of them [P, k] (with top_k > 0); None where not asked."""
    hidden: torch.Tensor | None
    top_ids: torch.Tensor | None


def top_k_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[..., k] long: the k tokens of highest logit per row, best first, on the logits' device (one
    kernel, no host read): StepResult.top_ids and DecodeState.prompt_top_ids."""
    return logits.topk(k, dim=-1).indices


PREFILL_CHUNK = 2048     # EngineConfig.prefill_chunk's default: prompt tokens per prefill forward
ROW_LINEAR = 8           # EngineConfig.row_linear's default: the most rows a forward through the RowLinear twin has
# prompt rows per drafter forward when a drafter catches up on a prompt (draft model, EAGLE): it runs
# on top of the target's whole KV cache and the prompt's features, so with a quarter of the prefill's
# chunk its activations stay below the target prefill's last chunk
CATCH_UP_CHUNK = PREFILL_CHUNK // 4


def _selects_hidden_states_by_index() -> bool:
    """Whether this transformers reads a list `output_hidden_states` as indices into the usual
    `hidden_states` tuple (0 = embeddings, -1 = the last layer after the final norm), keeping those
    entries alone. Releases that have `selected_hidden_states` do; the capture code of earlier 5.x
    releases read a list as decoder-layer numbers with no negative indices (our -1 came back None),
    and 4.x forwards read it as True."""
    try:
        from transformers.utils.output_capturing import selected_hidden_states  # noqa: F401
    except ImportError:
        return False
    return True


SELECTS_BY_INDEX = _selects_hidden_states_by_index()


def hidden_request(layers: Sequence[int] | None) -> list[int] | bool:
    """The model's `output_hidden_states` argument for features of `layers`: the indices themselves
    where this transformers records those layers only (the others' entries of `hidden_states` being
    None); elsewhere True, every layer (the same features, more memory)."""
    if layers is None:
        return False
    return list(layers) if SELECTS_BY_INDEX else True


def features(hidden_states, layers: Sequence[int]) -> torch.Tensor:
    """[L, F] target features of one sequence: the hidden states of `layers` (indices into HF's
    `hidden_states` tuple: 0 = embeddings, -1 = last layer post final norm) side by side.
    F = len(layers) * H; layers (-1,) is what the lm_head reads."""
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)


def pending_ids(pending_token: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """[1] long on `device`: the pending token as the forward's first input id. A device tensor is
    used as it is; an int (a call's first step, or a token the host decided) is copied over."""
    if isinstance(pending_token, torch.Tensor):
        return pending_token.reshape(1).to(device)
    return host_to_device([pending_token], device)


class Verifier:
    def __init__(self, model, compile: bool = False, prefill_chunk: int = PREFILL_CHUNK, row_linear: int = ROW_LINEAR):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (prompt tokens per prefill forward), got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = int(prefill_chunk)
        self.layout = attention_layout(model)     # refuses attention it cannot verify trees on
        if compile and self.layout.recurrent:
            raise IncompatibleModelsError(
                f"compile: true: the target ({type(model).__name__}) has linear-attention layers, whose state the "
                f"verifier rolls back by running accepted tokens again, which the static compiled forward cannot; "
                f"set compile: false")
        self.cache = None
        # a target with recurrent layers (layout.recurrent): their state before the last forward, and that
        # forward's input ids, for the commit to roll back to (RecurrentRollback)
        self.rollback: RecurrentRollback | None = None
        self.prefix_len = 0            # committed tokens whose KV is in the cache (all but the pending one)
        self.capacity: int | None = None     # cache entries to allocate at the next prefill (None: grow)
        # the tree shapes' tables this verifier's forwards, commits and acceptance read (shared by its
        # calls' twins): freed with it, bounded (specdec.tables)
        self.tables = ShapeTables()
        self.static = StaticForward(model, self.layout, tables=self.tables) if compile else None
        # forwards of at most row_linear rows run through the model's RowLinear twin (specdec.row_linear);
        # row_linear is the setting in effect: 0 where the model has no twin (compiled, no float32 CPU linear)
        self.row_model = row_twin(model) if int(row_linear) > 0 and self.static is None else None
        self.row_linear = int(row_linear) if self.row_model is not None else 0
        # whether the twin's large layers run packed weights: they win at every row count, so then every
        # forward takes the twin, the prefill's included
        self.packed = runs_packed(self.row_model)
        if self.layout.recurrent:
            check_rollback(self)

    def for_call(self) -> "Verifier":
        """A verifier for a call that overlaps another: the same model, attention layout and shape
        tables, a KV cache of its own (and, compiled, a static cache of its own)."""
        twin = copy.copy(self)
        twin.cache, twin.prefix_len, twin.capacity, twin.rollback = None, 0, None, None
        twin.static = self.static.for_call() if self.static is not None else None
        return twin

    def reserve(self, entries: int | None) -> None:
        """Size the next sequence's cache once for `entries` (prompt + max_new_tokens + the largest
        forward); a sequence that outgrows it still works (the buffers grow)."""
        self.capacity = entries

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prefill(self, token_ids: Sequence[int], feature_layers: Sequence[int] | None = None) -> torch.Tensor | None:
        """Start a new sequence: put the KV entries of `token_ids` (all committed tokens but the
        pending one) in a fresh cache, `prefill_chunk` tokens per forward. With feature_layers,
        return their features [len, F]."""
        return self.prefill_outputs(token_ids, feature_layers).hidden

    @torch.inference_mode()
    def prefill_outputs(self, token_ids: Sequence[int], feature_layers: Sequence[int] | None = None,
                        top_k: int = 0) -> "Prefilled":
        """prefill(), with the target's top-k next tokens after every prefilled token when top_k > 0
        (Prefilled.top_ids [len, k], from each chunk's logits, which are then computed on every row
        instead of the last one only)."""
        self.prefix_len = 0
        if self.static is not None:
            self.static.start(self.capacity or len(token_ids) + 1)
            self.cache = self.static.cache
        else:
            self.cache = new_cache(self.model, "target", self.capacity, recurrent=self.layout.recurrent)
        self.rollback = None
        if not len(token_ids):
            return Prefilled(None, None)
        ids = host_to_device([list(token_ids)], self.device)     # [1, P]
        hidden, top = [], []
        for start in range(0, ids.shape[1], self.prefill_chunk):
            chunk = ids[:, start: start + self.prefill_chunk]                           # [1, C]
            out = self._prefill_chunk(chunk, feature_layers, every_row=top_k > 0)
            if feature_layers is not None:
                hidden.append(features(out.hidden_states, feature_layers)[: chunk.shape[1]])   # [C, F]
            if top_k:
                top.append(top_k_ids(out.logits[0, : chunk.shape[1]], top_k))                # [C, k]
            del out                        # the next chunk's peak does not hold this one's outputs
            self.prefix_len += chunk.shape[1]
        return Prefilled(torch.cat(hidden) if feature_layers is not None else None, torch.cat(top) if top_k else None)

    def _prefill_chunk(self, chunk: torch.Tensor, feature_layers: Sequence[int] | None, every_row: bool = False):
        """One prefill forward of `chunk` [1, C] after the prefix_len entries in the cache; the
        logits of its last row only (the prefill reads none), or of every row with every_row."""
        if self.static is not None:      # parents None: a chain, its mask computed (no table per chunk length)
            return self.static.run(chunk, None, self.prefix_len, hidden_request(feature_layers),
                                   last_logits_only=not every_row)
        positions = self._positions(chunk.shape[1])
        model = self.row_model if self.packed else self.model
        return model(input_ids=chunk, position_ids=positions, **cache_kwargs(self.model, self.cache),  # as
                          use_cache=True, logits_to_keep=0 if every_row else 1,                     # generate() does
                          output_hidden_states=hidden_request(feature_layers))

    @torch.inference_mode()
    def forward(self, pending_token: int | torch.Tensor, tree: CandidateTree,
                feature_layers: Sequence[int] | None = None) -> TreeOutput:
        """Target outputs for the pending token and every tree node, in one forward (and their
        features, with feature_layers). pending_token: an int, or [1] long on the device (the loop
        keeps the last verdict's token there: no copy from the host)."""
        pending = pending_ids(pending_token, self.device)                           # [1]
        input_ids = torch.cat([pending, tree.tokens.to(self.device)])[None]       # [1, 1 + N]
        if self.static is not None:
            return self._static_forward(input_ids, tree, feature_layers)
        if self.layout.recurrent:      # nothing drafts through such a target's own layers: no lower run
            self._keep_rollback(input_ids, tree)
        else:
            run = self._lower_run(tree, feature_layers)
            if run is not None:
                return self._resumed_forward(input_ids, run)
        if tree.is_chain:   # a chain is causal: the model builds its own mask(s), windows included
            # with explicit positions, as generate() passes them: given none, some models derive other
            # positions (RoBERTa: from the input ids). No 2-D mask: an all-ones one costs a host read
            # inside transformers' mask building
            mask = None
            positions = self._positions(input_ids.shape[1])
        else:
            parents = with_pending_root(tree.parents)
            mask = tree_masks(self.layout, parents, self.prefix_len, self.model.dtype, self.device, tables=self.tables)
            positions = tree_position_ids(parents, self.prefix_len, self.device, self.tables)
        model = self._forward_model(input_ids.shape[1])
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                    **cache_kwargs(self.model, self.cache), use_cache=True,
                    output_hidden_states=hidden_request(feature_layers))
        hidden = features(out.hidden_states, feature_layers) if feature_layers is not None else None
        return TreeOutput(out.logits[0], hidden, None if tree.is_chain else parents)

    def _keep_rollback(self, input_ids: torch.Tensor, tree: CandidateTree) -> None:
        """Before a forward over [pending] + a chain on a target with recurrent layers: keep their state
        (the commit rolls back to it when a draft is rejected). A tree is refused: one recurrent state
        cannot follow two branches."""
        if not tree.is_chain:
            raise StrategyError(
                f"the target ({type(self.model).__name__}) has linear-attention layers, so specdec verifies chains on "
                f"it, and the strategy proposed a tree of {tree.num_nodes} nodes with branches: use a strategy that "
                f"drafts chains here (auto, token_recycling, prompt_lookup, draft_model with its default chain), "
                f"or autoregressive")
        self.rollback = RecurrentRollback.keep(self.cache, input_ids)

    def _positions(self, rows: int) -> torch.Tensor:
        """[1, rows] the positions of a forward's rows after the prefix_len committed entries."""
        return torch.arange(self.prefix_len, self.prefix_len + rows, device=self.device)[None]

    def _forward_model(self, rows: int):
        """What a forward of `rows` rows runs: the RowLinear twin (packed weights win at every row count;
        else up to row_linear rows), or the model itself."""
        return self.row_model if self.packed or rows <= self.row_linear else self.model

    def _lower_run(self, tree: CandidateTree, feature_layers: Sequence[int] | None) -> LowerRun | None:
        """The tree's LowerRun where this forward can resume it: a chain, no features asked (the parts
        give logits only), and the cache's first layer holding exactly the prefix and the run's rows.
        Anything a strategy wrote past the prefix that the forward does not resume is dropped first, so
        the whole forward then writes every layer's rows after the prefix, as usual."""
        run = tree.lower_run
        if run is not None and tree.is_chain and feature_layers is None \
                and self.cache.layers[0].get_seq_length() == self.prefix_len + run.rows:
            return run
        if any(layer.get_seq_length() > self.prefix_len for layer in self.cache.layers):
            commit_rows(self.cache, self.prefix_len, [])
        return None

    def _resumed_forward(self, input_ids: torch.Tensor, run: LowerRun) -> TreeOutput:
        """The target's logits for input_ids [1, 1 + N] (a chain) whose first run.rows rows already ran
        through the layers below the split: the layers below run on the other rows only (their KV
        appended after the run's), then the layers above on every row's exit states. The same logits
        and the same cache as the whole forward, up to rounding (tests/test_early_exit_reuse.py)."""
        positions = self._positions(input_ids.shape[1])
        states = run.states                                                         # [rows, H]
        if input_ids.shape[1] > run.rows:        # the chain's last node: drafted, never fed to the draft
            states = torch.cat([states, run.split.lower(input_ids[:, run.rows:], positions[:, run.rows:], self.cache)])
        return TreeOutput(run.split.upper_logits(states, positions, self.cache), None, None)   # [1 + N, V]

    def _static_forward(self, input_ids: torch.Tensor, tree: CandidateTree,
                        feature_layers: Sequence[int] | None) -> TreeOutput:
        rows = input_ids.shape[1]
        out = self.static.run(input_ids, with_pending_root(tree.parents), self.prefix_len, hidden_request(feature_layers))
        logits = out.logits[0, :rows]                                              # [1 + N, V], padding dropped
        hidden = features(out.hidden_states, feature_layers)[:rows] if feature_layers is not None else None
        if self.static.mode == "reduce-overhead":     # CUDA graph outputs are overwritten by the next replay
            logits, hidden = logits.clone(), None if hidden is None else hidden.clone()
        bucket = bucket_rows(rows, self.static.buckets)
        parents = with_pending_root(tree.parents)
        return TreeOutput(logits, hidden, padded_parents(parents, bucket) if bucket else parents)

    def commit(self, kept_rows: Sequence[int], kept_on_device: torch.Tensor | None = None) -> None:
        """Keep the rows `kept_rows` of the last forward (0 = pending token, then the accepted
        nodes' rows, ascending) after the prefix. The last kept row's token is the new last
        committed one before the next pending token. kept_on_device: the same rows [K] on the
        device (loop.kept_rows_on_device), used to move them without a copy from the host."""
        commit_rows(self.cache, self.prefix_len, kept_rows, kept_on_device)
        if self.rollback is not None:
            self._roll_back(len(kept_rows))
        self.prefix_len += len(kept_rows)

    @torch.inference_mode()
    def _roll_back(self, kept: int) -> None:
        """After a chain's commit on a target with recurrent layers: where the forward's last rows were
        rejected, put the recurrent state back as it was before the forward and run the kept rows (the
        pending token and the accepted drafts, a leading run of the forward's rows) through the target
        again. Their attention KV is rewritten with the same values; the logits are not computed but
        for one row. This second forward is what a rejection costs on such a target."""
        rollback, self.rollback = self.rollback, None
        if kept == rollback.input_ids.shape[1]:
            return                                   # every row kept: the state is the forward's own
        rollback.restore(self.cache)
        commit_rows(self.cache, self.prefix_len, [])                          # attention layers: the prefix only
        if kept:                  # none kept (the cost profile undoing a timed forward): the state before is all
            self._forward_model(kept)(input_ids=rollback.input_ids[:, :kept], position_ids=self._positions(kept),
                                      **cache_kwargs(self.model, self.cache), use_cache=True, logits_to_keep=1)


@dataclass
class RecurrentRollback:
    """The recurrent layers' state before a forward (copies of each LinearAttention layer's conv and
    recurrent states and flags), and that forward's input ids [1, R]: what the commit needs to undo
    the forward's rejected rows (Verifier._roll_back; their positions follow the prefix)."""
    states: list
    input_ids: torch.Tensor

    @staticmethod
    def keep(cache, input_ids: torch.Tensor) -> "RecurrentRollback":
        states = []
        for layer in cache.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                states.append((layer, {i: None if t is None else t.clone() for i, t in layer.conv_states.items()},
                               {i: None if t is None else t.clone() for i, t in layer.recurrent_states.items()},
                               dict(layer.has_previous_state)))
        return RecurrentRollback(states, input_ids)

    def restore(self, cache) -> None:
        """Put the kept states back, in place where the layer's tensor is still the same size (its
        address stays the one Hugging Face marked static), else as the layer's tensor."""
        for layer, conv, recurrent, flags in self.states:
            for held, saved in ((layer.conv_states, conv), (layer.recurrent_states, recurrent)):
                for index, tensor in saved.items():
                    current = held.get(index)
                    if tensor is not None and current is not None and current.shape == tensor.shape:
                        current.copy_(tensor)
                    else:
                        held[index] = tensor
            layer.has_previous_state.update(flags)


ROLLBACK_PROBE = (3, 5, 7, 9, 11, 13)    # token ids of the load-time rollback probe (any ids in the vocabulary)


@torch.inference_mode()
def check_rollback(verifier: Verifier) -> None:
    """Refuse a target with recurrent layers unless a rolled-back step leaves what a plain forward
    computes: on a cache of its own, a chain of three drafts of which one is kept, then the next
    token's logits, against the model's own forward over the same five tokens. Raised as an
    IncompatibleModelsError where the model cannot run on specdec's cache at all (MiniMax keeps a
    cache class of its own) or where the logits differ (its state does not live where the rollback
    keeps it)."""
    from .models import output_vocab_size
    model = verifier.model
    ids = [token % output_vocab_size(model) for token in ROLLBACK_PROBE]
    probe = verifier.for_call()
    try:
        probe.prefill(ids[:2])
        probe.forward(ids[2], CandidateTree.chain(ids[3:6]))
        probe.commit([0, 1])                                                 # ids[2], ids[3] kept: rolled back
        rolled = probe.forward(ids[4], CandidateTree.empty(verifier.device)).logits[0]                  # [V]
        plain = model(input_ids=host_to_device([ids[:5]], verifier.device)).logits[0, -1]                  # [V]
    except Exception as exc:  # noqa: BLE001 - whatever the model raises on specdec's cache, said in the error
        raise IncompatibleModelsError(
            f"the target ({type(model).__name__}) has linear-attention layers, and a forward on specdec's cache "
            f"failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}): use plain model.generate()") from exc
    scale = plain.abs().max().clamp_min(1.0)
    if not torch.allclose(rolled.float(), plain.float(), rtol=0, atol=float(scale) * 1e-2):
        raise IncompatibleModelsError(
            f"the target ({type(model).__name__}) has linear-attention layers whose state specdec cannot roll back: "
            f"after a rejected draft its next logits differ from a plain forward's by "
            f"{(rolled.float() - plain.float()).abs().max().item():.3g}; use plain model.generate()")

