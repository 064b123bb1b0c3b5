"""medusa: K heads on the target's last hidden state guess the next tokens; their top guesses form
a tree the verifier checks in one forward. No second model, no extra target forward: the hidden
state comes from the target's last forward (the row that produced the pending token: the prefill's
last row at the first step, then StepResult.hidden[-1]), so node depth d (0 = the pending token's
child) is guessed by head d + 1.

Trees of per-head ranks (a path [r0, r1, ...] takes head 1's r0-th best token, then head 2's
r1-th best, ...):
  * dynamic: the max_nodes paths of highest cumulative head probability (the product of the
    heads' probabilities along the path) over ranks < top_k, by the best-first search eagle's
    greedy trees use too (strategies/best_first.py);
  * static: a fixed list of rank paths (Medusa's "choices").
Token-conditioned heads (head k also reads the token before the one it guesses) cannot score a
whole path from one hidden state: a node's children come from the next head run on that node's
own token, so both their trees are built depth by depth, one batched head call per depth (the
dynamic one keeps only the nodes still among the best so far, which is exact). Plain heads score
every path from one call of all heads.
Greedy proposals are point masses (draft_probs None). At temperature > 0 under the rejection
sampler the tree carries the heads' real distributions: siblings drawn without replacement from
the head's warped distribution, the tree shaped as eagle's (strategies/sampled_tree.py; a static
`choices` list then shapes only greedy and coupled trees). The K heads' vocabulary projections
run as one matmul (MedusaHeads.project); host reads: one per step (plain heads) or per depth
(token-conditioned), none for static trees.
Greedy trees may be continued under their deepest leaf by `table_chain` nodes of the target's own top-1
predictions (strategies/leaf_chain.py, as eagle's), at no head call; a temperature sizes its trees by
sampled_max_nodes, with no chain.
Under the coupled sampler (state.noise) each head ranks tokens by its warped logits plus the
target's Gumbel noise at the position it guesses (specdec.coupled.coupled_scores), so its best
guess is its own coupled sample; the tree is then chosen from those perturbed scores as above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional
from typing import Sequence

import torch

from specdec.config import setting
from specdec.coupled import GumbelNoise, coupled_scores
from specdec.errors import ConfigError
from specdec.models import output_vocab_size
from specdec.sampling import logits_to_probs
from specdec.strategies.base import BaseStrategy
from specdec.strategies import draft_vocab
from specdec.strategies.best_first import best_first_tree, top_children
from specdec.strategies.sampled_tree import sampled_tree
from specdec.tables import ShapeTables
from specdec.tree import CandidateTree, to_device, host_to_device
from specdec.types import DecodeState, StepResult
from specdec.strategies.leaf_chain import TableChained

@dataclass
class MedusaConfig:
    """The `medusa:` section (the tree); the heads' folder is `heads.path`. Defaults suit a CPU
    (configs/medusa.yaml); on a GPU wider trees are nearly free: raise max_nodes and sampled_max_nodes (e.g. 64)
    and top_k, with table_chain 0."""
    tree: str = setting("dynamic", choices=("dynamic", "static"))   # dynamic: best nodes by cumulative head
    #                                     probability; static: the paths in `choices`
    choices: Optional[List[List[int]]] = None   # static tree: paths of per-head ranks, e.g. [[0], [0, 0], [1]]
    max_nodes: int = setting(8, min=1)      # dynamic tree node budget at greedy (configs/medusa.yaml: 2, with the
    #                                     table chain), and at a temperature where sampled_max_nodes is null
    top_k: int = setting(4, min=1)          # candidates considered per head (dynamic tree)
    sampled_max_nodes: Optional[int] = setting(None, min=1)   # the node budget at a temperature: the dynamic
    #                                     tree's under either sampler, any tree's under the rejection sampler (no
    #                                     table chain continues them there); null = max_nodes
    table_chain: int = setting(0, min=0)    # greedy: the tree's deepest leaf continued by this many nodes of the
    #                                     target's own top-1 predictions (strategies/leaf_chain.py), at no head call; 0 = off


@dataclass
class HeadsConfig:
    """The `heads:` section."""
    path: Optional[str] = None          # folder written by `specdec train-heads`


CONFIG_SECTIONS = {"medusa": MedusaConfig, "heads": HeadsConfig}




def ranks_to_tree(rank_paths: Sequence[Sequence[int]], head_tokens: torch.Tensor, device,
                  tables: ShapeTables | None = None) -> CandidateTree:
    """Rank paths (and their prefixes) -> a trie of tokens; head_tokens [D, k]: row d = depth d's
    head's tokens by rank (distinct within a row, so distinct rank paths are distinct token paths).
    The tokens are gathered on the device: no host read (the rank index kept in `tables`)."""
    paths = sorted({tuple(p[:end]) for p in rank_paths for end in range(1, len(p) + 1)}, key=lambda p: (len(p), p))
    if not paths:
        return CandidateTree.empty(device)
    node_of = {path: i for i, path in enumerate(paths)}
    parents = tuple(node_of[p[:-1]] if len(p) > 1 else -1 for p in paths)
    key = tuple(paths)
    depth_index, rank_index = (_rank_index(key, head_tokens.device) if tables is None       # [N], [N]
                               else tables.get(_rank_index, key, head_tokens.device))
    return CandidateTree(head_tokens[depth_index, rank_index].to(device), parents)


def _rank_index(paths: tuple[tuple[int, ...], ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth [N], rank [N]) of each node of a static tree on the device, made once per tree and kept
    in its Medusa's tables (not copied from the host every step)."""
    table = to_device(torch.tensor([[len(p) - 1 for p in paths], [p[-1] for p in paths]], dtype=torch.long), device)
    return table[0], table[1]


class ConditionedExpander:
    """Children of tree nodes for token-conditioned heads: the top-k guesses of head depth + 1 run on
    the hidden state and each parent's token (depth 0 = children of the pending token). With the
    coupled sampler's `noise`, depth d's guesses are ranked with the noise of position first + d."""

    def __init__(self, heads, hidden: torch.Tensor, top_k: int, noise: GumbelNoise | None = None, first: int = 0):
        self.heads, self.hidden, self.top_k = heads, hidden, top_k              # hidden [H]
        self.noise, self.first = noise, first

    def logits(self, depth: int, parent_tokens) -> torch.Tensor:
        """parent_tokens [n] (ints or a tensor) -> [n, V] head depth + 1's logits, one batched call."""
        ids = host_to_device(parent_tokens, self.hidden.device).view(-1)   # [n]
        return self.heads(self.hidden.expand(len(ids), -1), ids, head=depth + 1).float()

    def scores(self, depth: int, parent_tokens) -> torch.Tensor:
        """[n, V] what children are ranked by: the logits, plus under the coupled sampler the noise
        of the position depth + 1's head guesses."""
        logits = self.logits(depth, parent_tokens)                                   # [n, V]
        if self.noise is None:
            return logits
        return coupled_scores(logits, [self.first + depth] * logits.shape[0], self.noise)

    def children(self, depth: int, parent_tokens) -> tuple[list[list[float]], torch.Tensor]:
        """parent_tokens [n] -> (log-probs [n][k] on the host, tokens [n, k] on the device) of each
        parent's best children (-inf: a filtered-out token). One host read."""
        return top_children(self.scores(depth, parent_tokens), self.top_k)


def _as_parents(pending: int | torch.Tensor):
    """The pending token as the parent tokens of depth 0: [1] on the device as the engine keeps it
    (DecodeState.pending: no copy from the host), or [pending] for an int."""
    return pending.reshape(1) if isinstance(pending, torch.Tensor) else [pending]


def best_first_nodes(expander: ConditionedExpander, pending: int, depth_limit: int,
                     max_nodes: int) -> CandidateTree:
    """The max_nodes nodes of highest cumulative log-probability (strategies.best_first), a node's
    children coming from the next head run on that node's own token; one batched head call (and
    one host read) per depth."""
    def children(depth, nodes, tokens, parents):
        return expander.children(depth, _as_parents(pending) if tokens is None else tokens)
    return best_first_tree(children, depth_limit, max_nodes, expander.hidden.device)


def best_plain_nodes(head_logits: torch.Tensor, top_k: int, max_nodes: int, device) -> CandidateTree:
    """The max_nodes nodes of highest cumulative head probability for plain heads: head d + 1 gives
    every depth-d node the same children (head_logits [D, V]: row d = head d + 1's scores). One host
    read (the heads' top-k log-probabilities)."""
    logprobs, tokens = top_children(head_logits, top_k)                       # [D][k], [D, k]

    def children(depth, nodes, _tokens, parents):
        return [logprobs[depth]] * len(nodes), tokens[depth].expand(len(nodes), -1)
    return best_first_tree(children, len(logprobs), max_nodes, device)


def static_nodes(expander: ConditionedExpander, pending: int, rank_paths: Sequence[Sequence[int]]) -> CandidateTree:
    """A static tree of rank paths (and their prefixes), expanded depth by depth; no host read."""
    paths = sorted({tuple(p[:end]) for p in rank_paths for end in range(1, len(p) + 1)}, key=lambda p: (len(p), p))
    node_of: dict[tuple[int, ...], int] = {}
    tokens: list[torch.Tensor] = []      # 0-d token tensors, on the device
    parents: list[int] = []
    device = expander.hidden.device
    for depth in range(max((len(p) for p in paths), default=0)):
        level = [p for p in paths if len(p) == depth + 1]
        parent_keys = sorted({p[:-1] for p in level})
        parent_tokens = (host_to_device(_as_parents(pending), device) if depth == 0
                         else torch.stack([tokens[node_of[key]] for key in parent_keys]))
        width = max(p[-1] for p in level) + 1
        scores = expander.scores(depth, parent_tokens)                              # [n, V]
        children = scores.topk(min(width, scores.shape[-1]), dim=-1).indices       # [n, width]
        row_of = {key: row for row, key in enumerate(parent_keys)}
        for path in level:
            node_of[path] = len(tokens)
            tokens.append(children[row_of[path[:-1]], path[-1]])
            parents.append(node_of[path[:-1]] if depth else -1)
    if not tokens:
        return CandidateTree.empty(device)
    return CandidateTree(torch.stack(tokens), tuple(parents))


class Medusa(TableChained, BaseStrategy):
    name = "medusa"
    needs_hidden_states = True

    # defaults: MedusaConfig's, the one source of them
    def __init__(self, heads, tree: str = MedusaConfig.tree, choices: Sequence[Sequence[int]] | None = MedusaConfig.choices,
                 max_nodes: int = MedusaConfig.max_nodes, top_k: int = MedusaConfig.top_k,
                 table_chain: int = MedusaConfig.table_chain,
                 sampled_max_nodes: int | None = MedusaConfig.sampled_max_nodes):
        if tree not in ("dynamic", "static"):
            raise ConfigError(f"medusa.tree must be 'dynamic' or 'static', got {tree!r}")
        if max_nodes < 1 or top_k < 1 or (sampled_max_nodes is not None and sampled_max_nodes < 1):
            raise ConfigError(f"medusa.max_nodes, medusa.sampled_max_nodes and medusa.top_k must be >= 1, got "
                              f"{max_nodes}, {sampled_max_nodes}, {top_k}")
        self.ask_table_chain(table_chain, "medusa.table_chain")
        self.vocab = 0                        # the target's logits' width (bind)
        self.heads = heads.eval()
        self.tree = tree
        self.max_nodes = int(max_nodes)
        self.sampled_max_nodes = self.max_nodes if sampled_max_nodes is None else int(sampled_max_nodes)
        self.top_k = int(top_k)
        self.choices = None
        if tree == "static":
            if not choices:
                raise ConfigError("medusa.tree=static needs medusa.choices: a list of rank paths, e.g. "
                                  "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]")
            self.choices = [tuple(int(r) for r in c) for c in choices]
            for c in self.choices:
                if not c or len(c) > heads.num_heads or min(c) < 0:
                    raise ConfigError(f"medusa.choices entry {list(c)} is not a path of ranks (>= 0) of length "
                                      f"1..{heads.num_heads} (one rank per head)")
        self.device = torch.device("cpu")
        self.last_hidden: torch.Tensor | None = None     # [H] the row that produced the pending token
        self.tables = ShapeTables()                      # a static tree's rank index (its per-call copies share it)

    # ------------------------------------------------------------------ protocol
    def bind(self, target, tokenizer) -> None:
        from specdec.heads.io import HEADS_FILES, bind_heads, check_module_fits_target
        check_module_fits_target(HEADS_FILES, self.heads, target)
        bind_heads(self.heads, target)
        self.device = target.device
        self.vocab = output_vocab_size(target)

    def reset(self, state: DecodeState) -> None:
        hidden = state.prompt_hidden                   # [P - 1, H]; None for a one-token prompt
        self.last_hidden = hidden[-1] if hidden is not None and len(hidden) else None
        self.start_chain(self.vocab, self.device, state)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> CandidateTree:
        return self.chained(self._heads_tree(state), state)

    def _heads_tree(self, state: DecodeState) -> CandidateTree:
        """The heads' own tree (greedy, coupled or sampled), without the table chain."""
        depth = min(self.heads.num_heads, state.max_depth)
        budget = self.max_nodes if state.sampling.greedy else self.sampled_max_nodes
        last_hidden = self.last_hidden
        if last_hidden is None or depth <= 0:           # a one-token prompt: no hidden state yet
            return CandidateTree.empty(self.device)
        conditioned = self.heads.layout.token_conditioned
        pending = state.pending if state.pending is not None else state.token_ids[-1]   # on the device if there
        noise, first = state.noise, len(state.token_ids)        # depth d guesses position first + d
        if not state.sampling.greedy and noise is None:         # rejection sampler: real distributions
            return self._sampled_tree(last_hidden, depth, state, budget)
        if self.tree == "static":
            paths = [c for c in self.choices if len(c) <= depth]
            width = max(max(c) for c in paths) + 1 if paths else 1
            if conditioned:
                return static_nodes(ConditionedExpander(self.heads, last_hidden, width, noise, first), pending, paths)
            head_tokens = self._head_logits(last_hidden, depth, state).topk(width, dim=-1).indices   # [D, width]
            return ranks_to_tree(paths, head_tokens, self.device, self.tables)
        if conditioned:
            return best_first_nodes(ConditionedExpander(self.heads, last_hidden, self.top_k, noise, first), pending,
                                    depth, budget)
        return best_plain_nodes(self._head_logits(last_hidden, depth, state), self.top_k, budget, self.device)

    def _head_logits(self, last_hidden: torch.Tensor, depth: int, state: DecodeState) -> torch.Tensor:
        """[D, V] the first `depth` heads' logits (one stacked vocabulary matmul); under the coupled
        sampler, their warped logits plus the noise of the position each guesses."""
        logits = self.heads(last_hidden)[:depth].float()                     # [D, V]
        if state.noise is None:
            return logits
        first = len(state.token_ids)
        return coupled_scores(logits, range(first, first + depth), state.noise)

    def _sampled_tree(self, last_hidden: torch.Tensor, depth: int, state: DecodeState, budget: int) -> CandidateTree:
        """Temperature > 0 under the rejection sampler: the heads' real (warped) distributions, siblings
        drawn without replacement (strategies.sampled_tree, as eagle). Head d + 1 gives the children
        of depth-d nodes: plain heads the same distribution for every such node (all heads in one
        call), token-conditioned heads one batched call per depth on the parents' drawn tokens."""
        sampling = state.sampling
        if self.heads.layout.token_conditioned:
            expander = ConditionedExpander(self.heads, last_hidden, self.top_k)
            pending = state.pending if state.pending is not None else state.token_ids[-1]
            root_probs = logits_to_probs(expander.logits(0, _as_parents(pending))[0], sampling)     # [V]

            def next_probs(depth, nodes, tokens, parents):
                return logits_to_probs(expander.logits(depth + 1, tokens), sampling)                   # [n, V]
        else:
            head_probs = logits_to_probs(self.heads(last_hidden)[:depth].float(), sampling)           # [D, V]
            root_probs = head_probs[0]

            def next_probs(depth, nodes, tokens, parents):
                return head_probs[depth + 1].expand(len(nodes), -1)                                  # [n, V]
        return sampled_tree(root_probs, next_probs, depth, budget, self.top_k, state.rng)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.observe_chain(result)
        self.last_hidden = result.hidden[-1]            # [H] the row that produced the new pending token


def from_config(cfg, target, tokenizer, device, dtype) -> Medusa:
    from specdec.errors import ModelLoadError
    from specdec.heads.io import load_heads
    if not cfg.heads.path:
        raise ModelLoadError("strategy medusa needs trained heads: set heads.path=/folder/written/by/"
                             "`specdec train-heads` (train them with `specdec train-heads target=...`)")
    heads = load_heads(cfg.heads.path, target)
    heads.vocab_subset = draft_vocab.from_config(cfg, tokenizer, heads.layout.vocab_size, "the heads")
    m = cfg.medusa
    return Medusa(heads, tree=m.tree, choices=[list(c) for c in m.choices] if m.choices else None,
                  max_nodes=m.max_nodes, top_k=m.top_k, table_chain=m.table_chain, sampled_max_nodes=m.sampled_max_nodes)
