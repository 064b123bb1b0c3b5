"""A drafted tree's deepest leaf, continued by the target's own earlier predictions (token recycling's table,
strategies/token_recycling.py, at k = 1), at no drafter forward.

A neural drafter's tree (eagle) ends where its drafter stops: at `depth` levels, or where the path
probability left is below `stop_below`. On code, most steps keep the tree's whole deepest path, and the
target's next tokens there are often the ones it predicted after the same token before. So the chain under
the deepest leaf is read from a `vocab x 1` table of the target's top-1 next token the last time it read each
token: `length` more nodes, one gather each, on the device (no host read, no drafter forward). The table
is filled as token_recycling fills its own: after every verify forward, each row's token takes the target's
top-1 there (StepResult.top_ids: the strategy asks top_k_ids = 1). A call's table starts from its prompt's
text (each token's row: the token after its last occurrence), what the target's top-1 there mostly is: so the
prefill keeps computing its last row's logits alone (top_k_prefill false: every prompt row's logits would cost
a long prompt's prefill a [chunk, vocab] tensor per chunk). Where the prefill computes top ids anyway (auto
holding token_recycling), those seed it.

The chain's nodes are point masses, functions of the context: lossless under every sampler. They are
added only to greedy trees (draft_probs None, greedy): at a temperature the target's top-1 is kept with
its probability only.

The table lives for one call (allocated at reset, seeded from the call's prefill): a call's drafts never
depend on another call's text.
"""
from __future__ import annotations

import torch

from specdec.errors import ConfigError
from specdec.tree import CandidateTree, host_to_device
from specdec.types import DecodeState, StepResult

from .token_recycling import recycle


class TableChained:
    """What a drafter whose greedy trees a table chain may continue (eagle, medusa, draft_model) has of it: the
    chain's settings (ask_table_chain, at construction), this call's chain (start_chain, at reset), the tree with
    the chain (chained), the nodes it added (chain_nodes); the drafter's observe feeds it each step (observe_chain)."""
    table_chain = 0
    chain: "LeafChain | None" = None

    def ask_table_chain(self, length: int, key: str) -> None:
        """A chain of `length` nodes (`key`: its config key, for the error; 0 = off): the verifier then computes
        the target's top-1 at every row of a step (top_k_ids 1) and nothing more at the prefill, since the chain's
        table seeds from the prompt's text."""
        if length < 0:
            raise ConfigError(f"{key} must be >= 0 (nodes under the deepest leaf; 0 = off), got {length}")
        self.table_chain = int(length)
        self.top_k_ids = 1 if length else 0
        self.top_k_prefill = False

    def start_chain(self, vocab: int, device, state: DecodeState) -> None:
        """This call's chain over a table of the target's `vocab` (0 before bind: none), or none where it is off."""
        self.chain = LeafChain(self.table_chain, vocab, device, state) if self.table_chain and vocab else None

    def chained(self, tree: CandidateTree, state: DecodeState) -> CandidateTree:
        """The tree with the table chain under its deepest leaf, where there is one."""
        return tree if self.chain is None else self.chain.extend(tree, state)

    @property
    def chain_nodes(self) -> range:
        """The node indices of the last proposed tree that the table chain added (auto calibrates them apart)."""
        return range(0) if self.chain is None else self.chain.nodes

    def observe_chain(self, result: StepResult) -> None:
        """The step's verdict to this call's chain, where there is one (its table learns the step's rows)."""
        if self.chain is not None:
            self.chain.observe(result)


class LeafChain:
    """One call's chain: `length` table nodes under a tree's deepest leaf. vocab: the target's logits' width;
    the table is seeded from the call's prefill where it computed top ids (state.prompt_top_ids: row i follows
    token_ids[i]), else from the prompt's text."""

    def __init__(self, length: int, vocab: int, device, state: DecodeState):
        if length < 1:
            raise ValueError(f"a leaf chain needs length >= 1, got {length}")
        self.length, self.device = int(length), device
        self.table = torch.zeros(vocab, 1, dtype=torch.long, device=device)   # [V, 1]: the target's top-1 after each token
        self.nodes = range(0)                       # the chain's node indices in the last extended tree
        if len(state.token_ids) > 1:
            prompt = host_to_device(state.token_ids, self.device)                      # [P]
            following = prompt[1:, None] if state.prompt_top_ids is None else state.prompt_top_ids.to(self.device)
            recycle(self.table, prompt[:-1], following)                                # [P - 1] rows

    def observe(self, result: StepResult) -> None:
        """Every row of the verify forward overwrites its token's row with the target's top-1 there."""
        if result.top_ids is not None and result.input_ids is not None:
            recycle(self.table, result.input_ids.to(self.device), result.top_ids.to(self.device))

    def extend(self, tree: CandidateTree, state: DecodeState) -> CandidateTree:
        """tree with the chain hung under its deepest leaf (the first one drafted at the largest depth),
        within state.max_depth; the tree itself where there is no chain to add."""
        self.nodes = range(0)
        n = tree.num_nodes
        if not n or tree.draft_probs is not None or not state.sampling.greedy:
            return tree
        depths = tree.depths()                                                          # 0 = a root child
        deepest = max(depths)
        length = min(self.length, state.max_depth - (deepest + 1))
        if length <= 0:
            return tree
        leaf = depths.index(deepest)
        token = tree.tokens[leaf: leaf + 1]                                            # [1] on the device
        chain = []
        for _ in range(length):
            token = self.table[token, 0]                                               # [1]
            chain.append(token)
        self.nodes = range(n, n + length)
        return CandidateTree(torch.cat([tree.tokens, *chain]), tree.parents + (leaf,) + tuple(range(n, n + length - 1)))
