"""eagle: an EAGLE-style feature drafter (specdec.heads.eagle) proposes an EAGLE-2 dynamic tree.

The drafter keeps its own KV cache of *committed* rows: row u reads the target's feature at u
(from the prefill, then from each verify forward: StepResult.hidden) and the token u + 1. At a
step the pending token has no target feature yet, so the tree hangs off the last committed row
(the feature that produced the pending token, with the pending token's embedding); its output's
distribution gives the tree's first level. Deeper levels feed the drafter its own outputs and the
drafted tokens, one batched drafter forward per depth, each node seeing the committed rows, its
tree ancestors and itself. Tree rows are never committed: after the verdict the accepted path's
real target features arrive in observe() and are fed at the next proposal (a rollback is free).

Trees:
  * greedy (EAGLE-2): each expanded node gets its `top_k` most likely children; depth by depth the
    `expand` best nodes of the newest level (by cumulative draft probability) that are still among
    the max_nodes best candidates so far are expanded in one drafter forward; the tree is then the
    best `max_nodes` candidates. With expand >= max_nodes this is the exact best-max_nodes tree of
    the top_k-ary candidate tree, `depth` levels at most (candidates only get worse deeper down, so
    a node outside the best set can never be chosen later); a smaller `expand` (EAGLE-2's rule,
    default top_k) bounds the drafter's rows per depth. `stop_below` ends the expansion early, once
    the nodes to expand hold less path probability in all than it (their children can add at most
    that many expected tokens; a drafter forward costs a share of a target forward). Point masses
    (draft_probs None).
    `score_temperature` (default 0.5): the tree is ranked by the drafter's log-probabilities
    divided by it (a softmax at that temperature). A drafter distilled on the target's soft
    distributions is under-confident in its top child and over-confident in the alternatives,
    while greedy verification keeps only the target's argmax, so its top child is kept far more
    often than its draft probability says. Raw scores (1.0) build bushy, shallow trees; 0.5 builds
    the deeper ones greedy keeps (benchmarks/results/defaults.md has what was measured).
  * the coupled sampler (temperature > 0): greedy's best-first tree, ranked by the target's noise
    (`scorer`), `sampled_depth` levels at most (every tree at a temperature takes that depth: greedy's
    `depth` is sized beside the table chain, which greedy trees alone get).
  * sampling (temperature > 0, rejection sampler): the tree carries the drafter's real
    distributions, built by strategies/sampled_tree.py (shared with medusa), `sampled_depth` levels
    (default 4) of `sampled_top_k` slots (default 1: a chain; null = depth / top_k): per depth the
    best slots by a score blind to the token a slot receives, each parent's children drawn without
    replacement from its warped distribution q, one drafter forward per depth. Lossless
    (tests/test_eagle_law.py).
  * the table chain (greedy, `table_chain` nodes, default 6; off inside auto): the first deepest leaf is
    continued from the target's own top-1 after each token (strategies/leaf_chain.py), at no drafter forward.
    By default greedy trees are one level deep (`depth` 1): the level the catch-up forward gives (every step
    pays that forward to feed the drafter the accepted rows), then the chain. Each deeper level is a drafter
    forward (about 0.6 ms on pycode's drafter, more right after a target forward), and on a CPU the chain's
    nodes kept about as many tokens for none (benchmarks/results/eagle_depth).
Host reads: one per depth (the candidates' scores); drafted tokens stay on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdec.cache import BufferedLayer
from specdec.config import setting
from specdec.coupled import coupled_scores
from specdec.errors import ConfigError
from specdec.sampling import logits_to_probs
from specdec.strategies.base import BaseStrategy
from specdec.models import output_vocab_size
from specdec.strategies import draft_vocab
from specdec.strategies.best_first import best_first_tree, top_children
from specdec.strategies.leaf_chain import TableChained
from specdec.strategies.sampled_tree import sampled_tree
from specdec.tables import ShapeTables
from specdec.tree import CandidateTree, tree_shape, tree_visibility, with_pending_root, host_to_device
from specdec.types import DecodeState, StepResult
from specdec.verifier import CATCH_UP_CHUNK

@dataclass
class EagleConfig:
    """The `eagle:` section. Defaults suit a CPU (configs/eagle.yaml); on a GPU wider trees are
    nearly free (max_nodes 60, top_k 10, depth 8, table_chain 0)."""
    path: Optional[str] = None          # folder written by `specdec train-heads train_eagle` (eagle.json + weights)
    max_nodes: int = setting(5, min=1)      # tree node budget
    top_k: int = setting(4, min=1)          # children considered per node (greedy and the coupled sampler)
    depth: int = setting(1, min=1)          # greedy: drafter levels at most (sampled_depth at a temperature); 1 = the
    #                                     level the catch-up forward gives, continued by the table chain; with
    #                                     table_chain 0, use about 8
    expand: Optional[int] = setting(None, min=1)   # greedy: nodes expanded per depth (None = top_k, EAGLE-2;
    #                                     >= max_nodes = exact best tree)
    stop_below: float = setting(0.2, min=0.0, max=1.0)   # greedy: stop expanding once the nodes to expand hold
    #                                     less path probability in all than this (0 = always `depth` levels)
    sampled_top_k: Optional[int] = setting(1, min=1)    # sampling (rejection): nodes per level (1 = a chain; null = top_k)
    sampled_depth: Optional[int] = setting(4, min=1)    # at a temperature, under either sampler: levels (null =
    #                                     depth); the rejection sampler verifies every sampled node
    score_temperature: float = setting(0.5, above=0.0)  # greedy: the tree is ranked by the drafter's probabilities
    #                                     at this temperature (< 1 sharpens; 1 = as drafted)
    table_chain: int = setting(6, min=0)    # greedy: the tree's deepest leaf continued by this many nodes read
    #                                     from the target's own top-1 predictions (token recycling's table), at
    #                                     no drafter forward (strategies/leaf_chain.py); 0 = off
    batch_rows: bool = True             # in a batch (generate(list)), draft every row's tree level in one drafter
    #                                     forward (strategies/eagle_batch.py); false: each row drafts alone
    dtype: Optional[str] = setting("auto", choices=(None, "auto", "float32", "float16", "bfloat16", "int8"))   # the
    #                                     drafter's dtype: null = the target's; auto = bfloat16 beside a float32 target
    #                                     on CUDA, or on a CPU where a drafter forward is measured faster in it; int8 =
    #                                     int8 weights and bfloat16 activations, on a CPU (specdec/int8_linear.py)


CONFIG_SECTIONS = {"eagle": EagleConfig}




class Eagle(TableChained, BaseStrategy):
    name = "eagle"
    needs_hidden_states = True

    def __init__(self, drafter, max_nodes: int = EagleConfig.max_nodes, top_k: int = EagleConfig.top_k,
                 depth: int = EagleConfig.depth, expand: int | None = EagleConfig.expand,
                 stop_below: float = EagleConfig.stop_below,
                 sampled_top_k: int | None = EagleConfig.sampled_top_k,
                 sampled_depth: int | None = EagleConfig.sampled_depth,
                 score_temperature: float = EagleConfig.score_temperature, dtype: str | torch.dtype | None = None,
                 batch_rows: bool = EagleConfig.batch_rows, table_chain: int = EagleConfig.table_chain):
        if max_nodes < 1 or top_k < 1 or depth < 1 or (expand is not None and expand < 1):
            raise ConfigError(f"eagle.max_nodes, eagle.top_k, eagle.depth and eagle.expand must be >= 1, got "
                              f"{max_nodes}, {top_k}, {depth}, {expand}")
        if not 0.0 <= stop_below <= 1.0:
            raise ConfigError(f"eagle.stop_below must be in [0, 1] (a path probability; 0 = always expand to "
                              f"eagle.depth), got {stop_below}")
        self.stop_below = float(stop_below)
        # sampled trees (rejection sampling): their own width and depth (None = top_k / depth); every
        # sampled node is verified, so on a CPU a short chain (width 1) pays best
        self.sampled_top_k = int(sampled_top_k) if sampled_top_k is not None else int(top_k)
        self.sampled_depth = int(sampled_depth) if sampled_depth is not None else int(depth)
        if self.sampled_top_k < 1 or self.sampled_depth < 1:
            raise ConfigError(f"eagle.sampled_top_k and eagle.sampled_depth must be >= 1 (or null), got "
                              f"{sampled_top_k}, {sampled_depth}")
        if not score_temperature > 0:
            raise ConfigError(f"eagle.score_temperature must be > 0 (1 = the drafter's own probabilities), "
                              f"got {score_temperature}")
        self.score_temperature = float(score_temperature)
        self.batch_rows = bool(batch_rows)
        self.ask_table_chain(table_chain, "eagle.table_chain")
        self.vocab = 0                      # the target's logits' width (bind)
        self.dtype = dtype                       # the drafter's dtype: None = the target's; "auto" = measured (bind)
        self.drafter = drafter.eval()
        self.max_nodes, self.top_k, self.depth = int(max_nodes), int(top_k), int(depth)
        self.expand = int(expand) if expand is not None else self.top_k   # nodes expanded per depth (greedy)
        self.feature_layers = tuple(drafter.layout.feature_layers)
        self.device = torch.device("cpu")
        self.tables = ShapeTables()         # its tree shapes' tables (its per-call copies share them)
        self.reset_cache()

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        from specdec.heads.eagle_io import EAGLE_FILES, bind_eagle, drafter_dtype
        from specdec.heads.io import check_module_fits_target
        check_module_fits_target(EAGLE_FILES, self.drafter, target)
        bind_eagle(self.drafter, target, drafter_dtype(self.dtype, target, self.drafter))
        self.device = target.device
        self.vocab = output_vocab_size(target)

    def reset_cache(self) -> None:
        self.kv = BufferedLayer()           # rows 0..fed: the committed rows; a tree's rows after them
        self.fed = 0                        # committed rows in the cache (row u: feature u, token u + 1)
        self.unfed: list[torch.Tensor] = []   # [n, F] target features not fed yet
        self.unfed_tokens: list[torch.Tensor] | None = []   # [n] their next tokens on the device (None: from the host)
        self.root = None                    # (out [H], logits [V]) of the last committed row

    def reset(self, state: DecodeState) -> None:
        self.reset_cache()
        self.start_chain(self.vocab, self.device, state)
        if state.prompt_hidden is not None and len(state.prompt_hidden):
            self.unfed.append(state.prompt_hidden)     # [P - 1, F]
            self.unfed_tokens = None                   # the prompt's tokens come from the host

    def levels(self, state: DecodeState) -> int:
        """The drafter's tree levels at this step: `depth` at greedy, where the table chain continues the
        tree; `sampled_depth` at a temperature, under either sampler (the chain is greedy's only)."""
        return min(self.depth if state.sampling.greedy else self.sampled_depth, state.max_depth)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> CandidateTree:
        depth_limit = self.levels(state)
        root = self.catch_up(state.token_ids)
        if root is None or depth_limit <= 0:            # a one-token prompt: no target feature yet
            return CandidateTree.empty(self.device)
        if state.sampling.greedy or state.noise is not None:    # the coupled sampler ranks by the target's noise
            return self.chained(self._greedy_tree(*root, depth_limit, self.scorer(state)), state)
        return self._sampled_tree(*root, depth_limit, state)

    # ------------------------------------------------------------------ batched drafting (specdec.batch)
    def batch_drafter(self):
        """The drafter a batch runs for all its rows at once (propose_many): this one, unless batch_rows
        is off."""
        return self if self.batch_rows else None

    def batch_key(self) -> int:
        """Rows whose eagles share this key draft in one EagleBatch: the drafter module's."""
        return id(self.drafter)

    def new_batch(self):
        from .eagle_batch import EagleBatch
        return EagleBatch(self.drafter, self.device)

    def propose_start(self, state: DecodeState) -> bool:
        """Phase one of a batched proposal: whether this row calls its drafter (always, here)."""
        return True

    def propose_end(self, state: DecodeState, drafted: CandidateTree | None, drafted_s: float | None) -> CandidateTree:
        """Phase two: the row's tree from what its drafter proposed in the batch."""
        return drafted if drafted is not None else CandidateTree.empty(self.device)

    @staticmethod
    @torch.inference_mode()
    def propose_many(eagles, states, batch) -> list[CandidateTree]:
        """Every row's tree with ONE drafter forward per level for all rows (and one for their
        catch-up), through `batch` (an EagleBatch over this drafter): what propose() gives each row
        alone, drafted side by side."""
        batch.catch_up(eagles, states)
        depths = [eagle.levels(state) for eagle, state in zip(eagles, states)]
        trees = [CandidateTree.empty(eagle.device) for eagle in eagles]
        live = [i for i, (eagle, depth) in enumerate(zip(eagles, depths)) if eagle.root is not None and depth > 0]
        if live:
            built = batch.trees([eagles[i] for i in live], [states[i] for i in live], [depths[i] for i in live])
            for i, tree in zip(live, built):
                trees[i] = eagles[i].chained(tree, states[i])
        return trees

    @staticmethod
    def _coupled_scorer(state: DecodeState):
        """[n, V] drafter logits of nodes at `depth` -> scores whose top-k are the coupled proposals:
        warped logits + the Gumbel noise of the position their children guess (len(token_ids) + depth)."""
        def score(logits: torch.Tensor, depth: int) -> torch.Tensor:
            positions = [len(state.token_ids) + depth] * logits.shape[0]
            return coupled_scores(logits, positions, state.noise)
        return score

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.observe_chain(result)
        self.unfed.append(result.hidden)               # [1 + accepted, F]: the pending row, then the accepted
        self.root = None
        # the rows' next tokens on the device: the accepted path's, then the new pending one. Only where this
        # result's token is the pending one: inside auto, a step of the drafter's may be followed by tokens
        # lookup added (strategies/auto.drafter_steps), and its rows then take their tokens from the host
        ends_at_pending = result.committed_before + result.num_accepted + 1 == len(state.token_ids)
        if self.unfed_tokens is not None and state.pending is not None and ends_at_pending:
            accepted = result.tree.tokens[: result.num_accepted] if result.tree.is_chain else \
                result.tree.tokens.index_select(0, tree_shape(with_pending_root(result.tree.parents),
                                                              result.tree.tokens.device, self.tables)
                                                .path(result.next_row, result.num_accepted + 1)[1:] - 1)
            self.unfed_tokens += [accepted.to(state.pending.device), state.pending]
        else:
            self.unfed_tokens = None

    def _sharpened(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """Greedy trees' ranking scores: the drafter's logits at score_temperature."""
        return logits / self.score_temperature

    @property
    def past_k(self) -> torch.Tensor | None:
        """[1, heads, fed, d]: keys of the committed rows (a view; None before any)."""
        return self.kv.key_buffer[:, :, : self.fed] if self.fed else None

    @property
    def past_v(self) -> torch.Tensor | None:
        return self.kv.value_buffer[:, :, : self.fed] if self.fed else None

    # ------------------------------------------------------------------ the committed rows
    def catch_up(self, token_ids: list[int]):
        """Feed the committed rows not in the drafter's cache yet (one forward per CATCH_UP_CHUNK rows:
        a long prompt's peak activations are bounded by the chunk); returns the last row's (out [H],
        logits [V]) - the parent of the tree - or None before any feature."""
        unfed = self.take_unfed(token_ids)
        if unfed is not None:
            for g, tokens in zip(*(part.split(CATCH_UP_CHUNK) for part in unfed)):     # [m, H], [m] each
                m = g.shape[0]
                rows = torch.arange(self.fed, self.fed + m, device=self.device)          # [m]
                out, _, _, _ = self.drafter(g[None], tokens[None], rows[None], with_logits=False, cache=self.kv,
                                            start=self.fed)
                self.rows_fed(self.fed, out[0])
                self.fed += m
            self.root = (out[0, -1], self.drafter.logits(out[0, -1]).float())    # only the last row's logits
        return self.root

    def rows_fed(self, first_row: int, out: torch.Tensor) -> None:
        """The drafter's outputs out [m, H] of the committed rows from `first_row` on, as catch_up feeds them:
        kept by a drafter whose deeper modules read them (strategies/mtp_modules.py), dropped here."""

    def take_unfed(self, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The committed rows to feed, taken off the unfed list: (drafter inputs g [n, H], their next
        tokens [n] on the device), or None when there are none."""
        if not self.unfed:
            return None
        features = torch.cat(self.unfed).to(device=self.device, dtype=self._dtype())     # [n, F]
        on_device = torch.cat(self.unfed_tokens).to(self.device) if self.unfed_tokens else None   # [n]
        self.unfed, self.unfed_tokens = [], []
        n = features.shape[0]
        if len(token_ids) - 1 - self.fed < n:
            raise RuntimeError(f"eagle: {self.fed + n} features for {len(token_ids)} committed tokens "
                               f"(expected one fewer feature than tokens)")
        if on_device is None or len(on_device) != n:
            on_device = host_to_device(token_ids[self.fed + 1: self.fed + 1 + n], self.device)
        return self.drafter.input_features(features), on_device

    def _dtype(self) -> torch.dtype:
        return next(self.drafter.parameters()).dtype

    # ------------------------------------------------------------------ one tree level
    def _feed(self, tree, nodes: list[int], tokens: torch.Tensor, depth: int):
        """Run the drafter on the tree nodes `nodes` (all at `depth`, their parents already fed;
        tokens [n] their tokens, on the device) in one forward. tree: dict with the parent list,
        out / column maps and the parent row of each tree row in the cache (written after the
        committed rows, in feeding order). Returns logits [n, V] (fp32) and records each node's
        output and cache column."""
        g, tokens, positions, visible, start = self.level_inputs(tree, nodes, tokens, depth)
        out, logits, _, _ = self.drafter(g[None], tokens[None], positions[None], visible=visible[None],
                                         cache=self.kv, start=start)
        self.level_outputs(tree, nodes, out[0])
        return logits[0].float()

    def level_inputs(self, tree, nodes: list[int], tokens: torch.Tensor, depth: int):
        """The drafter's inputs for the tree nodes `nodes` (see _feed): (g [n, H], tokens [n], positions
        [n], visible [n, fed + tree rows in the cache + n], the cache row the first is written at);
        records their parents' cache rows."""
        parents, outs, column, fed_parents = tree["parent"], tree["out"], tree["column"], tree["fed_parents"]
        g = torch.stack([tree["root_out"] if parents[i] < 0 else outs[parents[i]] for i in nodes])   # [n, H]
        positions = torch.full((len(nodes),), self.fed + depth, device=self.device)
        fed_tree = len(fed_parents)                                         # tree rows in the cache
        fed_parents += [-1 if parents[i] < 0 else column[parents[i]] for i in nodes]
        # the cache's tree rows form a tree of their own (row -> parent row): each new row sees the
        # committed rows, its ancestors' rows and itself
        visible = tree_visibility(fed_parents, self.fed, self.device, first_row=fed_tree,
                                  tables=self.tables)                               # [n, fed + fed_tree + n]
        return g, tokens.to(self.device), positions, visible, self.fed + fed_tree

    @staticmethod
    def level_outputs(tree, nodes: list[int], out: torch.Tensor) -> None:
        """Record the drafter's outputs out [n, H] of the nodes `nodes` and their cache columns."""
        fed_tree = len(tree["fed_parents"]) - len(nodes)
        for row, node in enumerate(nodes):
            tree["out"][node] = out[row]
            tree["column"][node] = fed_tree + row

    @staticmethod
    def _new_tree(root_out) -> dict:
        return {"root_out": root_out, "parent": [], "out": {}, "column": {}, "fed_parents": []}

    # ------------------------------------------------------------------ greedy: exact best tree
    def _greedy_tree(self, root_out, root_logits, depth_limit: int, scorer=None) -> CandidateTree:
        """scorer(logits [n, V], depth) -> [n, V] scores to rank children by (default: the logits;
        greedy: at score_temperature; the coupled sampler adds its noise). Cumulative log-softmax of
        the scores ranks the nodes (strategies.best_first, expanding `expand` nodes per depth at most
        and stopping below `stop_below`). One drafter forward and one host read per depth (the
        children's log-probabilities); tokens stay on the device."""
        tree = self._new_tree(root_out)

        def children(depth: int, nodes: list[int], tokens, parents: list[int]):
            if tokens is None:                                  # the pending token's children
                logits = root_logits[None]                                              # [1, V]
            else:
                tree["parent"] = parents
                logits = self._feed(tree, nodes, tokens, depth - 1)                     # [n, V]
            return top_children(logits if scorer is None else scorer(logits, depth), self.top_k)

        return best_first_tree(children, depth_limit, self.max_nodes, self.device, self.expand, self.stop_below)

    def scorer(self, state: DecodeState):
        """How greedy / coupled trees rank children: scorer(logits [n, V], depth) -> scores, or None (the
        logits); None too for the rejection sampler's sampled trees."""
        if state.sampling.greedy:
            return self._sharpened if self.score_temperature != 1.0 else None
        return self._coupled_scorer(state) if state.noise is not None else None

    # ------------------------------------------------------------------ sampling: real distributions
    def _sampled_tree(self, root_out, root_logits, depth_limit: int, state: DecodeState) -> CandidateTree:
        """strategies.sampled_tree over the drafter's warped distributions; one drafter forward per depth."""
        tree = self._new_tree(root_out)

        def next_probs(depth: int, nodes: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            tree["parent"] = parents
            return logits_to_probs(self._feed(tree, nodes, tokens, depth), state.sampling)       # [n, V]

        return sampled_tree(logits_to_probs(root_logits, state.sampling), next_probs, depth_limit,
                            self.max_nodes, self.sampled_top_k, state.rng)


def from_config(cfg, target, tokenizer, device, dtype) -> Eagle:
    from specdec.errors import ModelLoadError
    from specdec.heads.eagle_io import TRAIN_HINT, load_eagle
    if not cfg.eagle.path:
        raise ModelLoadError(f"strategy eagle needs a trained drafter: set eagle.path=/folder/written/by "
                             f"{TRAIN_HINT}")
    drafter = load_eagle(cfg.eagle.path, target)
    if cfg.draft_vocab.size and not drafter.uses_target_lm_head:
        raise ConfigError(f"draft_vocab.size={cfg.draft_vocab.size} cuts a projection onto the whole vocabulary, and "
                          f"the EAGLE-3 drafter in {cfg.eagle.path} has its own lm_head (its draft vocabulary is chosen "
                          f"at training: `specdec train eagle layout=eagle3 draft_vocab_size=N`); leave draft_vocab.size "
                          f"at 0 for it")
    if drafter.uses_target_lm_head:
        drafter.vocab_subset = draft_vocab.from_config(cfg, tokenizer, drafter.layout.vocab_size, "the EAGLE drafter")
    e = cfg.eagle
    return Eagle(drafter, max_nodes=e.max_nodes, top_k=e.top_k, depth=e.depth, expand=e.expand,
                 stop_below=e.stop_below, sampled_top_k=e.sampled_top_k, sampled_depth=e.sampled_depth,
                 score_temperature=e.score_temperature, dtype=e.dtype, batch_rows=e.batch_rows,
                 table_chain=e.table_chain)
