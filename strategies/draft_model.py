"""draft_model: a separate small causal LM with the target's tokenizer guesses ahead.

Chain of gamma tokens, or a tree (per-depth branching: top-k children when greedy, siblings
sampled without replacement when sampling). The draft keeps its own KV cache: after each verdict
it keeps the entries of the accepted drafted tokens it already computed and catches up on the
rest (the bonus token) at the start of the next proposal. Optional adaptive gamma picks the chain
length that maximises expected tokens per unit of time from the acceptance history.
Drafted tokens stay on the device (sampled there too, by the random source's draw_without_replacement): a
chain reads nothing back per token (one read per token only with min_confidence > 0), a tree at
most one read per depth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional
from typing import Sequence

import torch

from specdec.cache import commit_rows, new_cache
from specdec.config import setting
from specdec.coupled import coupled_proposals, coupled_scores
from specdec.errors import ConfigError, StrategyError
from specdec.models import cache_kwargs, check_same_tokenizer, output_vocab_size
from specdec.processing import LogitsProcessing
from specdec.sampling import logits_to_probs
from specdec.tables import ShapeTables
from specdec.tree import (INDEPENDENT, WITHOUT_REPLACEMENT, CandidateTree, tree_masks, tree_position_ids, tree_shape,
                          with_pending_root)
from specdec.types import DecodeState, StepResult
from specdec.verifier import CATCH_UP_CHUNK

from .base import BaseStrategy
from . import draft_vocab
from .draft_vocab import DraftVocabConfig, VocabSubset
from .leaf_chain import TableChained
from .lean_forward import LeanForward, why_not_lean
from specdec.tree import host_to_device


@dataclass
class DraftConfig:
    """The `draft:` section."""
    path: Optional[str] = None          # checkpoint folder of the draft (same tokenizer as the target)
    num_tokens: int = setting(4, min=1)     # gamma: chain length (start value when adaptive)
    branching: Optional[List[int]] = setting(None, item_min=1)   # tree: children per node at each depth, e.g. [3, 2, 1, 1]
    max_nodes: int = setting(64, min=1)     # tree node budget
    adaptive: bool = False              # adapt gamma to the acceptance history (chains)
    min_tokens: int = setting(1, min=1)
    max_tokens: int = setting(12, min=1)
    draft_cost: float = setting(0.1, min=0.0)   # draft forward time / target forward time, for adaptive gamma
    min_confidence: float = setting(0.0, min=0.0, max=1.0)   # chains stop early where the draft's own token prob < this (0 = off)
    batch_rows: bool = True             # generate(list): all rows' chains (trees) in one draft forward per position
    #                                     (level); false: a forward per row, as before; kept for the A/B in benchmarks/results/batch
    lean_forward: bool = True           # one sequence: run a Llama, Qwen2 or Mistral draft's layers as plain tensor code
    #                                     (strategies/lean_forward.py), without Hugging Face's per-call costs; other
    #                                     drafts, and false, call the model's own forward
    dtype: Optional[str] = setting(None, choices=(None, "float32", "float16", "bfloat16"))   # the draft's dtype:
    #                                     null = the target's. Only drafting changes: the target verifies in its own
    #                                     (greedy identity holds; sampled drafts carry the probabilities they were drawn
    #                                     from). float16 beside a float32 target on a CPU halves the bytes each draft
    #                                     forward reads (benchmarks/results/draft_dtype); a draft whose activations
    #                                     overflow float16 there is stopped with an error saying so
    table_chain: int = setting(0, min=0)    # greedy chains: the chain continued by this many nodes of the target's own
    #                                     top-1 predictions (strategies/leaf_chain.py), at no draft forward; 0 = off


CONFIG_SECTIONS = {"draft": DraftConfig, "draft_vocab": DraftVocabConfig}


@dataclass
class ViewDraftConfig:
    """The chain / tree settings of a strategy whose draft is a view of the target (early_exit, layer_skip),
    which its section's dataclass extends. They mean what the `draft:` section's do."""
    num_tokens: int = setting(4, min=1)     # chain length (start value when adaptive)
    branching: Optional[List[int]] = setting(None, item_min=1)   # tree: children per node at each depth
    max_nodes: int = setting(64, min=1)     # tree node budget
    adaptive: bool = False                  # adapt the chain length to the acceptance history
    min_tokens: int = setting(1, min=1)
    max_tokens: int = setting(12, min=1)
    draft_cost: Optional[float] = setting(None, min=0.0)   # draft forward / target forward for adaptive length;
    #                                         None = the share of the target the draft runs (early_exit: E / L of
    #                                         its layers; layer_skip: of its decoder's parameters)
    min_confidence: float = setting(0.0, min=0.0, max=1.0)  # chains stop where the draft's own token prob < this
    batch_rows: bool = True                 # generate(list): all rows' drafts in one forward per position


def draft_attention_layout(draft):
    """The draft's attention layout (sliding windows per layer type), or None where the verifier's
    checks refuse it (e.g. a flash-attention draft: its trees then use a plain mask)."""
    from specdec.errors import IncompatibleModelsError
    from specdec.models import attention_layout
    try:
        return attention_layout(draft)
    except IncompatibleModelsError:
        return None


def convert_draft(draft, target, dtype: torch.dtype) -> None:
    """`draft` in `dtype` (draft.dtype), in place, but for its rotary embeddings' inverse frequencies, which stay in
    float32 as Hugging Face loads them (in 16 bits a cosine at position 1000 is off by up to 0.2 to 0.9, and the
    draft would guess worse the longer the context). A draft that shares weights with its target is refused:
    converting it would convert the target, and the target must verify in its own dtype."""
    target_storage = {p.data_ptr() for p in target.parameters()}
    if any(p.data_ptr() in target_storage for p in draft.parameters()):
        raise ConfigError(f"draft.dtype {str(dtype).removeprefix('torch.')}: the draft shares weights with the "
                          f"target, and converting it would convert the target too; give a draft of its own "
                          f"(or leave draft.dtype null)")
    frequencies = {name: buffer for name, buffer in draft.named_buffers() if name.endswith("inv_freq")}
    draft.to(dtype=dtype)
    for name, buffer in frequencies.items():
        owner, _, attribute = name.rpartition(".")
        setattr(draft.get_submodule(owner) if owner else draft, attribute, buffer)


def overflowed(logits: torch.Tensor) -> bool:
    """Whether draft logits [L, V] show an overflow: a NaN or +inf, or a row with no finite logit (-inf stands
    for the tokens a draft may not propose, never for all of them)."""
    return bool(torch.isnan(logits).any() or torch.isposinf(logits).any()
                or not torch.isfinite(logits).any(dim=-1).all())


def chain_rate(acceptance: float, draft_cost: float, length: int) -> float:
    """Expected new tokens per target-forward time of a chain of `length` drafted tokens, each accepted
    with probability `acceptance` (given its parent was): E[tokens] = (1 - a^(g+1)) / (1 - a), over
    the verify (one target forward) plus g draft forwards at `draft_cost` target forwards each."""
    a = min(acceptance, 0.999)
    return (1 - a ** (length + 1)) / (1 - a) / (1 + draft_cost * length)


class DraftModel(TableChained, BaseStrategy):
    name = "draft_model"
    needs_hidden_states = False

    # defaults: DraftConfig's, the one source of them
    def __init__(self, draft, *, num_tokens: int = DraftConfig.num_tokens,
                 branching: Sequence[int] | None = DraftConfig.branching, max_nodes: int = DraftConfig.max_nodes,
                 adaptive: bool = DraftConfig.adaptive, min_tokens: int = DraftConfig.min_tokens,
                 max_tokens: int = DraftConfig.max_tokens, draft_cost: float = DraftConfig.draft_cost,
                 min_confidence: float = DraftConfig.min_confidence, batch_rows: bool = DraftConfig.batch_rows,
                 draft_tokenizer=None, lean_forward: bool = DraftConfig.lean_forward,
                 vocab_subset: VocabSubset | None = None, dtype: str | torch.dtype | None = DraftConfig.dtype,
                 table_chain: int = DraftConfig.table_chain):
        if num_tokens < 1:
            raise ConfigError(f"draft.num_tokens must be >= 1, got {num_tokens}")
        if branching is not None and (not branching or any(int(b) < 1 for b in branching)):
            raise ConfigError(f"draft.branching must be a list of children per depth, each >= 1, got {branching}")
        if not 1 <= min_tokens <= max_tokens:
            raise ConfigError(f"need 1 <= draft.min_tokens <= draft.max_tokens, got {min_tokens}, {max_tokens}")
        self.draft = None
        self.num_tokens = int(num_tokens)
        self.ask_table_chain(table_chain, "draft.table_chain")
        self.branching = None if branching is None else [int(b) for b in branching]
        self.max_nodes = int(max_nodes)
        self.adaptive = adaptive
        self.min_tokens, self.max_tokens = int(min_tokens), int(max_tokens)
        self.draft_cost = float(draft_cost)
        self.min_confidence = float(min_confidence)
        self.batch_rows = bool(batch_rows)
        self.draft_tokenizer = draft_tokenizer
        self.lean_forward = bool(lean_forward)   # early_exit and layer_skip pass False: their views of the target
        #                                          keep the model's own forward
        self.lean = None                      # LeanForward of the draft, where lean_forward and it can run the draft
        self.vocab_subset = vocab_subset      # draft_vocab: the draft proposes only these tokens (strategies/draft_vocab.py)
        self.dtype = dtype                    # the draft's dtype: None = as loaded (from_config: the target's)
        self.layout = None                    # the draft's attention layout, known at bind
        self._check_overflow = False          # whether fit_vocab checks the draft's logits for float16 overflow (bind)
        self.tables = ShapeTables()           # its tree shapes' tables (its per-call copies share them)
        self.drafted = 0                      # nodes the draft itself proposed in the last tree (the chain's are after them)
        if draft is not None:                 # None: set by use_draft before bind (early_exit's view of the target)
            self.use_draft(draft)

    def use_draft(self, draft) -> None:
        """Draft with `draft` (a causal LM over the target's tokenizer)."""
        self.draft = draft.eval()
        self.vocab = output_vocab_size(draft)
        self.lean = (LeanForward(draft, self.vocab_subset) if self.lean_forward and why_not_lean(draft) is None
                     else None)

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        target_vocab = output_vocab_size(target)
        check_same_tokenizer(tokenizer, self.draft_tokenizer, target_vocab, self.vocab)
        self.vocab = target_vocab   # draft logits are cut / padded to the target's width
        self.draft.to(device=target.device)
        if self.dtype is not None:
            convert_draft(self.draft, target,
                          self.dtype if isinstance(self.dtype, torch.dtype) else getattr(torch, self.dtype))
        # float16 holds magnitudes up to 65504 (float32 and bfloat16 about 3e38): a draft's activations can overflow
        # it, and infinite or NaN logits would then reach the samplers. On a CPU reading a flag is free, so its logits
        # are checked there (on CUDA a check would cost a host sync per draft forward)
        self._check_overflow = (self.dtype is not None and self.draft.dtype == torch.float16
                                and target.device.type == "cpu")
        self.layout = draft_attention_layout(self.draft)
        self._target_processing = lambda prompt, max_new: LogitsProcessing.for_generation(target, prompt, max_new)

    def reset(self, state: DecodeState) -> None:
        self.cache = new_cache(self.draft)
        self.cached = 0                       # committed tokens whose KV is in the draft cache
        self.fed_nodes: list[int] = []        # tree nodes in the draft cache after `cached`, in order
        self.tail: torch.Tensor | None = None   # [u] the accepted tokens the draft was not fed (its chain's last, the
        #                                         table chain's), on the device
        self.gamma = self.num_tokens
        self.acceptance = 0.7                 # running estimate of the per-token acceptance rate
        self.processing = self._start_processing(state)
        self._committed: torch.Tensor | None = None   # [C] the committed ids on the device (processing only)
        self.batch = None   # the DraftBatch whose rows hold this row's KV (batched calls: specdec.batch), else own cache
        self.start_chain(self.vocab, self.draft.device, state)
        self.drafted = 0

    def draft_depth(self, state: DecodeState) -> int:
        """How deep a call now drafts: its tree's depth, or its chain's current length, within the step's room."""
        return min(len(self.branching) if self.branching else self.gamma, state.max_depth)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> CandidateTree:
        depth = self.draft_depth(state)
        device = self.draft.device
        if depth <= 0:
            return CandidateTree.empty(device)
        pending_logits = self._at_pending(self._catch_up(state.token_ids, state.pending), state)   # [V]
        if self.branching is None:
            return self.chained(chains([self], [state], [depth], [pending_logits], feed_alone)[0], state)
        return self.chained(self._tree(pending_logits, self.branching[:depth], state), state)

    def chained(self, tree: CandidateTree, state: DecodeState) -> CandidateTree:
        """The drafted tree with the table chain under its deepest leaf, where there is one (greedy only),
        keeping how many nodes the draft itself proposed (adaptive lengths learn from those)."""
        self.drafted = tree.num_nodes
        return super().chained(tree, state)

    # ------------------------------------------------------------------ batched drafting (specdec.batch)
    def chain_lengths(self) -> list[int] | range:
        """The chain lengths it may draft (a tree: its depth, priced as a chain: its accepted path)."""
        if self.branching is not None:
            return [len(self.branching)]
        return range(self.min_tokens, self.max_tokens + 1) if self.adaptive else [self.num_tokens]

    def batch_drafter(self):
        """The drafter whose proposals a batch runs together across its rows (propose_many): chains and
        trees alike (batch_rows false: each row drafts alone, for the A/B)."""
        return self if self.batch_rows else None

    def batch_key(self) -> int:
        """Rows whose drafters share this key draft in one DraftBatch: the draft model's."""
        return id(self.draft)

    def new_batch(self):
        from .draft_batch import DraftBatch
        return DraftBatch(self.draft, self.layout, self.tables)

    def propose_start(self, state: DecodeState) -> bool:
        """Phase one of a batched proposal: whether this row calls its drafter (always, here)."""
        return True

    def propose_end(self, state: DecodeState, drafted: CandidateTree | None, drafted_s: float | None) -> CandidateTree:
        """Phase two: the row's tree from what its drafter proposed in the batch."""
        return drafted if drafted is not None else CandidateTree.empty(self.draft.device)

    @staticmethod
    @torch.inference_mode()
    def propose_many(drafters: Sequence["DraftModel"], states: Sequence[DecodeState], batch) -> list[CandidateTree]:
        """Every row's chain (or tree) with ONE draft forward per chain position (tree level) for all rows
        and one for their catch-up, through `batch` (a DraftBatch over this draft model): what propose()
        gives each row alone, drafted side by side. The rows of a call share one configuration: all
        chains or all trees."""
        if drafters and drafters[0].branching is not None:
            return DraftModel._trees_together(drafters, states, batch)
        depths = [min(d.gamma, s.max_depth) for d, s in zip(drafters, states)]
        live = [i for i, depth in enumerate(depths) if depth > 0]
        trees = [CandidateTree.empty(d.draft.device) for d in drafters]
        if not live:
            return trees
        drafters, states, depths = [drafters[i] for i in live], [states[i] for i in live], [depths[i] for i in live]
        for drafter in drafters:
            drafter.batch = batch
        logits = [drafter._at_pending(row_logits, state)                              # per row [V]
                  for drafter, state, row_logits in zip(drafters, states, batch.catch_up(drafters, states))]
        for i, tree, drafter, state in zip(live, chains(drafters, states, depths, logits, batch.feed), drafters, states):
            trees[i] = drafter.chained(tree, state)
        return trees

    @staticmethod
    def _trees_together(drafters: Sequence["DraftModel"], states: Sequence[DecodeState], batch) -> list[CandidateTree]:
        """propose_many for trees: every row's tree level by level (strategies/lockstep.run_together),
        each level of every row in one draft forward (DraftBatch.tree_forward)."""
        from .lockstep import run_together
        depths = [min(len(d.branching), s.max_depth) for d, s in zip(drafters, states)]
        live = [i for i, depth in enumerate(depths) if depth > 0]
        trees = [CandidateTree.empty(d.draft.device) for d in drafters]
        if not live:
            return trees
        drafters, states, depths = [drafters[i] for i in live], [states[i] for i in live], [depths[i] for i in live]
        for drafter in drafters:
            drafter.batch = batch
        row_logits, pending = batch.catch_up(drafters, states, under_tree=True)
        builders = [drafter._tree_steps(drafter._at_pending(logits, state), drafter.branching[:depth], state)
                    for drafter, state, logits, depth in zip(drafters, states, row_logits, depths)]
        fed = {i: CandidateTree.empty(drafters[i].draft.device) for i in range(len(drafters))}   # each row's tree so far

        def answer_all(requests: dict[int, tuple]) -> dict[int, torch.Tensor]:
            for i, (tokens, parents, _) in requests.items():
                fed[i] = CandidateTree(tokens, parents)
            # every row feeds its pending token and its whole tree so far: a row not asking this round
            # writes again what it wrote, which the rows provisionally kept past its fill must keep
            logits = batch.tree_forward([(drafter, token, fed[i]) for i, (drafter, token) in
                                         enumerate(zip(drafters, pending))])               # per row [1 + n, Vd]
            return {i: drafters[i].fit_vocab(logits[i][1 + level_start: 1 + len(parents)])
                    for i, (_, parents, level_start) in requests.items()}

        for i, tree, drafter, state in zip(live, run_together(builders, answer_all), drafters, states):
            trees[i] = drafter.chained(tree, state)
        return trees

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.observe_chain(result)
        fed = set(self.fed_nodes)
        kept = [node for node in result.accepted if node in fed]     # a leading part of the path
        position = {node: i for i, node in enumerate(self.fed_nodes)}
        rows = [position[node] for node in kept]
        on_device = None
        if rows != list(range(len(rows))) and self.fed_nodes == list(range(len(self.fed_nodes))):
            # fed in node order (chains, trees level by level): the kept rows are the accepted path's nodes,
            # on the device in the tree shape's path table (in its own tables: copied once per shape)
            path = tree_shape(with_pending_root(result.tree.parents), self.cache_device(), self.tables).path(
                result.accepted[len(kept) - 1] + 1, len(kept) + 1)
            on_device = path[1:] - 1
        if self.batch is not None and self.branching is not None:   # the pending token and the kept nodes
            self.batch.keep_tree(self, rows, on_device)
        elif self.batch is not None:      # a chain's kept entries are a leading run of its fed ones: a new fill
            self.batch.keep(self, self.cached + len(kept))
        else:
            commit_rows(self.cache, self.cached, rows, on_device)
        self.cached += len(kept)
        unfed = result.accepted[len(kept):]     # the path's deepest drafted node and the table chain's, if not fed
        if unfed:                               # [u] on the device: slices of the tree's tokens, a run of nodes each
            self.tail = torch.cat([result.tree.tokens[start: stop] for start, stop in node_runs(unfed)]) \
                .to(self.draft.device)
        self.fed_nodes = []
        if self.adaptive and self.branching is None:     # the draft's own chain: the table chain's nodes come after it
            self._adapt(min(result.num_accepted, self.drafted), min(result.num_verified, self.drafted))

    def cache_device(self) -> torch.device:
        return self.draft.device

    # ------------------------------------------------------------------ drafting
    def _logits(self, input_ids: torch.Tensor, mask=None, positions=None, last_only: bool = False) -> torch.Tensor:
        """[L, V] draft logits of every input row ([1, V]: the last row's only)."""
        if self.lean is not None:     # every layer attends fully (why_not_lean): one mask, never a per-type dict
            return self.fit_vocab(self.lean(input_ids, mask, positions, self.cache, last_only))
        out = self.draft(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         **cache_kwargs(self.draft, self.cache), use_cache=True, logits_to_keep=1 if last_only else 0)
        return self.fit_vocab(out.logits[0])

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[L, Vd] draft logits -> [L, V] float, cut or padded (-inf) to the target's vocabulary (and -inf off
        draft_vocab's kept tokens, where the forward projected onto every token)."""
        logits = logits.float()
        if self._check_overflow and overflowed(logits):
            raise StrategyError(
                "the draft's float16 forward overflowed (logits NaN or infinite): its activations exceed float16's "
                "range on this text. Run the draft in bfloat16 (draft.dtype=bfloat16) or in the target's dtype "
                "(draft.dtype=null)")
        if self.vocab_subset is not None:
            logits = self.vocab_subset.mask(logits)
        if logits.shape[-1] > self.vocab:
            logits = logits[:, : self.vocab]
        elif logits.shape[-1] < self.vocab:
            pad = logits.new_full((logits.shape[0], self.vocab - logits.shape[-1]), float("-inf"))
            logits = torch.cat([logits, pad], dim=-1)
        return logits

    def _catch_up(self, token_ids: list[int], pending: torch.Tensor | None = None) -> torch.Tensor:
        """Feed the committed tokens the draft has not seen (at least the pending one), CATCH_UP_CHUNK
        tokens per forward (a long prompt's peak activations are bounded by the chunk). After a step
        they are the accepted tokens the draft was not fed (`tail`, on the device) and the
        pending one (`pending` [1], the engine's, on the device): nothing is copied from the host."""
        new = self.unfed(token_ids, pending)[None]                      # [1, C]
        for chunk in new.split(CATCH_UP_CHUNK, dim=1):                 # [1, C] each
            logits = self._logits(chunk, last_only=True)[-1]            # the lm_head on the last row only
        self.cached = len(token_ids)
        return logits

    def unfed(self, token_ids: list[int], pending: torch.Tensor | None) -> torch.Tensor:
        """[C] the committed tokens the draft has not been fed (at least the pending one), on the
        device: after a step the accepted tokens it was not fed (`tail`) and the pending one
        (both on the device already), else (a prompt, a gap) the ids from the host. Clears `tail`."""
        tail, self.tail = self.tail, None
        if pending is not None and tail is not None and len(token_ids) - self.cached == len(tail) + 1:
            return torch.cat([tail, pending.to(self.draft.device)])
        if pending is not None and tail is None and len(token_ids) - self.cached == 1:
            return pending.to(self.draft.device).view(1)
        return host_to_device(token_ids[self.cached:], self.draft.device)

    def _pick(self, logits: torch.Tensor, widths: list[int], state: DecodeState, position: int):
        """Children of R nodes at one depth from their [R, V] draft logits guessing `position`:
        (tokens [sum of R_i children] on the device, each node's child count, draft distributions
        [R, V] or None). Node r gets up to widths[r] children: the top ones when greedy; under the
        coupled sampler the top of (warped logits + the target's noise there); when sampling, drawn
        without replacement from its warped distribution. At most one host read per call."""
        width = max(widths)
        if state.noise is not None:
            positions = [position] * len(widths)
            if width == 1:       # each row's own coupled sample: no count of unfiltered tokens to read
                return (*self._first(coupled_scores(logits, positions, state.noise).topk(1).indices, widths), None)
            top = coupled_proposals(logits, positions, state.noise, width)        # [R, k'] (one read)
            return (*self._first(top, widths), None)
        if state.sampling.greedy:
            return (*self._first(torch.topk(logits, width, dim=-1).indices, widths), None)
        draft_probs = logits_to_probs(logits, state.sampling)                       # [R, V]
        if width > 1:            # draws without replacement need that many tokens of probability > 0
            available = (draft_probs > 0).sum(dim=-1).tolist()                       # the call's one read
            widths = [min(w, a) for w, a in zip(widths, available)]
        drawn = [state.rng.draw_without_replacement(draft_probs[r], w) for r, w in enumerate(widths) if w]
        return torch.cat(drawn), widths, draft_probs

    @staticmethod
    def _first(top: torch.Tensor, widths: list[int]):
        """top [R, k] ranked candidates -> (the first widths[r] of row r, concatenated; the counts)."""
        widths = [min(w, top.shape[1]) for w in widths]
        if all(w == top.shape[1] for w in widths):
            return top.reshape(-1), widths
        return torch.cat([top[r, :w] for r, w in enumerate(widths)]), widths

    def _unsure(self, logits: torch.Tensor, token: torch.Tensor, draft_probs: torch.Tensor | None) -> bool:
        """Stop the chain when the draft gave its own token less than min_confidence: the rest
        would likely be rejected and only widen the verify forward. (The chain's length depends
        on the draft alone, so the verdict stays lossless.)"""
        if self.min_confidence <= 0:
            return False
        probs = torch.softmax(logits, dim=-1) if draft_probs is None else draft_probs[0]   # [V]
        return bool(probs[token] < self.min_confidence)

    def _tree(self, logits: torch.Tensor, branching: list[int], state: DecodeState) -> CandidateTree:
        """Depth by depth: every node of the level gets its children in one pick (one host read at
        most) and the new level goes through the draft in one forward. Tokens stay on the device."""
        from .lockstep import run_steps
        return run_steps(self._tree_steps(logits, branching, state), self._feed_level)

    def _feed_level(self, tokens: torch.Tensor, parents: tuple[int, ...], level_start: int) -> torch.Tensor:
        """[L, V] the draft's logits of the level from level_start (the nodes' tokens [N]), each node
        seeing its ancestors only, on this row's own cache."""
        mask = self._tree_mask(parents, level_start)
        positions = tree_position_ids(parents, self.cached, self.draft.device, self.tables)
        return self._logits(tokens[level_start:][None], mask, positions[:, level_start:])

    def _tree_steps(self, logits: torch.Tensor, branching: list[int], state: DecodeState):
        """_tree as a step generator (strategies/lockstep.py): yields (tokens [N] of the nodes so far,
        their parents, first node of the new level) and takes the draft's logits [L, V] of that level;
        returns the tree."""
        tokens: list[torch.Tensor] = []      # per level: [L] its nodes' tokens
        parents: list[int] = []
        rows: list[torch.Tensor] = []        # per level: [L, V] the distribution each node was drawn from
        level_nodes, level_logits = [-1], logits[None]            # the level to expand: [R, V]
        level_paths = torch.empty(1, 0, dtype=torch.long, device=logits.device)   # [R, depth]
        for depth, width in enumerate(branching):
            level_start = len(parents)
            widths, room = [], self.max_nodes - level_start
            for _ in level_nodes:
                widths.append(max(0, min(width, room)))
                room -= widths[-1]
            if not any(widths):
                break
            live = sum(1 for w in widths if w)     # rows that get children: a prefix (room only shrinks)
            children, counts, draft_probs = self._pick(level_logits[:live], widths[:live], state,
                                                       len(state.token_ids) + depth)
            for r, count in enumerate(counts):
                parents += [level_nodes[r]] * count
            tokens.append(children)
            if draft_probs is not None:
                rows.append(_repeat_rows(draft_probs, counts))                       # [L, V]
            new_paths = torch.cat([_repeat_rows(level_paths[:live], counts), children[:, None]], dim=1)
            new_nodes = list(range(level_start, len(parents)))
            if depth == len(branching) - 1 or not new_nodes:
                break
            # one draft forward over the whole new level, each node seeing only its ancestors
            level_logits = yield torch.cat(tokens), tuple(parents), level_start                # [L, V]
            if self.processing:
                level_logits = self._process(level_logits, state, new_paths)
            self.fed_nodes.extend(new_nodes)
            level_nodes, level_paths = new_nodes, new_paths
        draft_probs = torch.cat(rows) if rows else None                             # [N, V]
        siblings = INDEPENDENT if draft_probs is None else WITHOUT_REPLACEMENT
        return CandidateTree(torch.cat(tokens), tuple(parents), draft_probs, siblings)

    def _tree_mask(self, parents: tuple[int, ...], level_start: int):
        """The draft's tree mask(s) for the rows from level_start on, with its own sliding windows
        (one [1, 1, L, cached + N] mask, or {layer type: mask}); a plain tree mask when its attention
        layout is unknown (drafts only guess: a wrong mask costs acceptance, never correctness)."""
        return tree_masks(self.layout, parents, self.cached, self.draft.dtype, self.draft.device, first_row=level_start,
                          tables=self.tables)

    # ------------------------------------------------------------------ the target's logits processing
    def _start_processing(self, state: DecodeState) -> LogitsProcessing:
        """The target's generation_config processing for this generation (none before bind)."""
        start = getattr(self, "_target_processing", None)
        if start is None:
            return LogitsProcessing()
        return start(state.token_ids[: state.prompt_len], state.max_depth + 1)

    def _at_pending(self, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """The draft's logits [V] at the pending token, processed as the target's would be there."""
        if not self.processing:
            return logits
        no_path = torch.empty(1, 0, dtype=torch.long, device=logits.device)
        return self._process(logits[None], state, no_path)[0]

    def _process(self, logits: torch.Tensor, state: DecodeState, drafted: torch.Tensor) -> torch.Tensor:
        """[R, V] draft logits processed as the target's generate() would process them: row r
        continues the committed ids + drafted[r] ([R, d] on the device, all paths of one length).
        Called only when the target's generation_config asks for processing."""
        if self._committed is None or len(self._committed) != len(state.token_ids):   # once per proposal, not per forward
            self._committed = host_to_device(state.token_ids, logits.device)
        committed = self._committed
        drafted = drafted.to(logits.device).view(len(logits), -1)
        return self.processing.rows(logits, torch.cat([committed.expand(len(logits), -1), drafted], dim=1))

    def _adapt(self, accepted: int, proposed: int) -> None:
        """Update the acceptance estimate and pick gamma maximising expected tokens per unit time:
        E[tokens] = (1 - a^(g+1)) / (1 - a), cost = 1 + c g (c = draft forward / target forward)."""
        trials = accepted + (1 if accepted < proposed else 0)
        if trials:
            self.acceptance = 0.8 * self.acceptance + 0.2 * (accepted / trials)
        self.gamma = max(range(self.min_tokens, self.max_tokens + 1),
                         key=lambda g: chain_rate(self.acceptance, self.draft_cost, g))


def chains(drafters: Sequence[DraftModel], states: Sequence[DecodeState], depths: Sequence[int],
           logits: Sequence[torch.Tensor], feed) -> list[CandidateTree]:
    """Each row's chain of up to depths[r] tokens from its draft logits [V] at the pending token, each
    token fed back to the draft: `feed([(drafter, token [1]), ...])` runs the draft on the rows still
    going (one forward for all of them in a batch; feed_alone: the row's own) and gives each its next
    logits [V]. The tokens never leave the device (no host read, unless min_confidence asks one per
    token and row)."""
    tokens: list[list[torch.Tensor]] = [[] for _ in drafters]
    rows: list[list] = [[] for _ in drafters]                  # per row: [1, V] draft distributions (sampling)
    logits = list(logits)
    going = list(range(len(drafters)))
    for i in range(max(depths)):
        fed = []
        for r in going:
            drafter, state = drafters[r], states[r]
            token, _, draft_probs = drafter._pick(logits[r][None], [1], state, len(state.token_ids) + i)   # [1]
            tokens[r].append(token)
            rows[r].append(draft_probs)
            if i < depths[r] - 1 and not drafter._unsure(logits[r], token, draft_probs):
                fed.append(r)
        going = fed
        if not going:
            break
        for r, next_logits in zip(going, feed([(drafters[r], tokens[r][-1]) for r in going])):
            drafter, state = drafters[r], states[r]
            if drafter.processing:
                next_logits = drafter._process(next_logits[None], state, torch.cat(tokens[r])[None])[0]
            logits[r] = next_logits
            drafter.fed_nodes.append(i)
    return [CandidateTree(torch.cat(row_tokens), tuple(range(-1, len(row_tokens) - 1)),
                          None if row_probs[0] is None else torch.cat(row_probs))             # [n, V]
            for row_tokens, row_probs in zip(tokens, rows)]


def node_runs(nodes: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending node indices as (start, stop) runs of consecutive ones: [4, 9, 10, 11] -> [(4, 5), (9, 12)]."""
    runs: list[tuple[int, int]] = []
    for node in nodes:
        if runs and runs[-1][1] == node:
            runs[-1] = (runs[-1][0], node + 1)
        else:
            runs.append((node, node + 1))
    return runs


def feed_alone(fed: Sequence[tuple[DraftModel, torch.Tensor]]) -> list[torch.Tensor]:
    """chains' feed for rows drafting on their own caches: one forward per row."""
    return [drafter._logits(token.view(1, 1))[-1] for drafter, token in fed]


def _repeat_rows(rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """[R, ...] -> [sum(counts), ...]: row r repeated counts[r] times, with the counts kept on the host
    (repeat_interleave with a tensor of counts would copy them to the device and read the size back)."""
    if counts and all(count == counts[0] for count in counts):
        return rows.repeat_interleave(counts[0], dim=0)
    return torch.cat([rows[r: r + 1].expand(count, *rows.shape[1:]) for r, count in enumerate(counts) if count])


def from_config(cfg, target, tokenizer, device, dtype) -> DraftModel:
    from specdec.models import load_model, load_tokenizer
    import os
    draft = load_model(cfg.draft.path, "draft", device, dtype)
    if target is not None:            # a draft distilled (specdec train-draft) for another target: say so
        from specdec.heads.draft_info import warn_if_distilled_for_another_target
        warn_if_distilled_for_another_target(cfg.draft.path, target, cfg.target.path)
    tok_path = cfg.draft.path
    draft_tokenizer = None
    if os.path.isfile(os.path.join(tok_path, "tokenizer.json")) or os.path.isfile(os.path.join(tok_path, "tokenizer_config.json")):
        draft_tokenizer = load_tokenizer(tok_path, "draft", key="draft.path")
    d = cfg.draft
    vocab_subset = draft_vocab.from_config(cfg, tokenizer, output_vocab_size(draft), "the draft")
    return DraftModel(draft, num_tokens=d.num_tokens, branching=list(d.branching) if d.branching else None,
                      max_nodes=d.max_nodes, adaptive=d.adaptive, min_tokens=d.min_tokens,
                      max_tokens=d.max_tokens, draft_cost=d.draft_cost, min_confidence=d.min_confidence,
                      batch_rows=d.batch_rows, draft_tokenizer=draft_tokenizer, lean_forward=d.lean_forward,
                      vocab_subset=vocab_subset, dtype=d.dtype, table_chain=d.table_chain)
