"""early_exit: the target drafts with its own first E layers, its final norm and its lm_head (LayerSkip,
Elhoushi et al. 2024; Hugging Face's `generate(assistant_early_exit=E)`).

The drafter is a *view* of the target (exit_view): a shallow copy of the model object whose decoder runs
the first E of the target's own layer modules, then the target's final norm and lm_head. No weight is
copied; the target itself is never changed (Hugging Face's generator instead sets the shared config's
num_hidden_layers for the duration of each draft, which a second thread using the model would see).
The view drafts exactly as a separate draft model would: `EarlyExit` is a `DraftModel` whose draft
is the view, so chains, trees, batches, the coupled sampler, adaptive length and the target's logits
processing all come from strategies/draft_model.py. The view keeps a KV cache of its own (its first E
layers' entries for the committed text), as Hugging Face's assistant does.

KV reuse (`reuse_kv`, LayerSkip's own scheme): the layers < E KV of a drafted token is exactly the
target's, so a chain of one sequence drafts on the target's own cache instead (the prompt then passes
layers < E once, in the prefill). Drafting writes layers < E for the pending token and each fed drafted
token and keeps their exit states; the chain goes to the verify with them (CandidateTree.lower_run), and
the verify runs layers < E for the chain's last token only, then layers >= E on every row's exit state
(strategies/exit_split.py); the verify's commit then crops the rejected rows from every layer. Trees,
batch rows and the compiled verifier draft on a cache of their own as before.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional

import torch

from specdec.cache import commit_rows
from specdec.config import setting
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.tree import CandidateTree, LowerRun, host_to_device
from specdec.types import DecodeState, StepResult

from .draft_model import DraftConfig, DraftModel, chains
from .exit_split import SplitTarget
# the views, read from here too by the tests and scripts/measure
from .layer_views import _check_runs_its_layers, decoder_layers, exit_view, num_layers, part_view  # noqa: F401

log = logging.getLogger(__name__)


@dataclass
class EarlyExitConfig:
    """The `early_exit:` section. The drafting settings mean what the `draft:` section's do."""
    exit_layer: int = setting(1, min=1)     # E: draft with the target's first E decoder layers (1 .. L - 1)
    num_tokens: int = setting(4, min=1)     # chain length (start value when adaptive)
    branching: Optional[List[int]] = setting(None, item_min=1)   # tree: children per node at each depth
    max_nodes: int = setting(64, min=1)     # tree node budget
    adaptive: bool = False                  # adapt the chain length to the acceptance history
    min_tokens: int = setting(1, min=1)
    max_tokens: int = setting(12, min=1)
    draft_cost: Optional[float] = setting(None, min=0.0)   # draft forward / target forward for adaptive
    #                                         length; None = E / L (the share of the layers it runs)
    min_confidence: float = setting(0.0, min=0.0, max=1.0)  # chains stop where the draft's own token prob < this
    batch_rows: bool = True                 # generate(list): all rows' drafts in one forward per position
    reuse_kv: bool = True                   # chains of one sequence draft on the target's own KV cache: the verify
    #                                         runs layers < E only for the last drafted token (LayerSkip); false:
    #                                         the draft keeps a cache of its own (trees and batches always do)


CONFIG_SECTIONS = {"early_exit": EarlyExitConfig}


class EarlyExit(DraftModel):
    """A DraftModel whose draft is exit_view(target, exit_layer), made at bind. With reuse_kv, a chain
    of one sequence drafts on the target's own cache instead (see the module's docstring)."""
    name = "early_exit"

    def __init__(self, exit_layer: int = EarlyExitConfig.exit_layer, *, num_tokens: int = EarlyExitConfig.num_tokens,
                 branching: List[int] | None = EarlyExitConfig.branching, max_nodes: int = EarlyExitConfig.max_nodes,
                 adaptive: bool = EarlyExitConfig.adaptive, min_tokens: int = EarlyExitConfig.min_tokens,
                 max_tokens: int = EarlyExitConfig.max_tokens, draft_cost: float | None = EarlyExitConfig.draft_cost,
                 min_confidence: float = EarlyExitConfig.min_confidence,
                 batch_rows: bool = EarlyExitConfig.batch_rows, reuse_kv: bool = EarlyExitConfig.reuse_kv):
        if int(exit_layer) < 1:
            raise ConfigError(f"early_exit.exit_layer must be >= 1 (the decoder layers the draft runs), got {exit_layer}")
        super().__init__(None, num_tokens=num_tokens, branching=branching, max_nodes=max_nodes, adaptive=adaptive,
                         min_tokens=min_tokens, max_tokens=max_tokens,
                         draft_cost=DraftConfig.draft_cost if draft_cost is None else draft_cost,
                         min_confidence=min_confidence, batch_rows=batch_rows)
        self.exit_layer = int(exit_layer)
        self.given_draft_cost = draft_cost
        self.reuse_kv = bool(reuse_kv)
        self.split = None              # the target in two parts over its cache (SplitTarget), where reuse applies
        self.reuse_off = "early_exit.reuse_kv is false" if not self.reuse_kv else None   # why not, where it does not

    def bind(self, target, tokenizer) -> None:
        self.use_draft(exit_view(target, self.exit_layer))
        if self.given_draft_cost is None:
            self.draft_cost = self.exit_layer / num_layers(target)
        super().bind(target, tokenizer)
        if self.reuse_kv:
            self._split_target(target)

    def _split_target(self, target) -> None:
        """Set `split` where the KV reuse applies to this target and shape, else say why in `reuse_off`."""
        if self.branching is not None:
            self.reuse_off = "trees draft on a KV cache of their own (the reuse covers chains)"
            log.info("early_exit: %s", self.reuse_off)
            return
        try:
            split = SplitTarget(target, self.exit_layer)
            split.check()
        except IncompatibleModelsError as exc:
            self.reuse_off = str(exc)
            log.warning("%s; drafting on a KV cache of its own instead", exc)
            return
        self.split, self.reuse_off = split, None

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        # one sequence on the eager verifier: draft on the target's cache; a batch row, or under compile, on its own
        self.sharing = self.split is not None and state.target_cache is not None
        self.exit_states: list[torch.Tensor] = []      # per fed row: [1, H] its exit state (sharing)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> CandidateTree:
        if not self.sharing:
            return super().propose(state)
        depth = min(self.gamma, state.max_depth)
        if depth <= 0:
            return CandidateTree.empty(self.draft.device)
        # every layer holds the prefix; rows of a chain of ours that no verify took (auto verified another
        # tree, or none) are dropped so that the chain's lower KV sits right after the prefix
        self.prefix_len = len(state.token_ids) - 1
        commit_rows(state.target_cache, self.prefix_len, [])
        self.exit_states = []
        pending = state.pending if state.pending is not None else host_to_device(state.token_ids[-1:], self.draft.device)
        logits = self._at_pending(self._exit_logits(pending.view(1, 1), state.target_cache), state)     # [V]
        tree = chains([self], [state], [depth], [logits],
                      lambda fed: [self._exit_logits(token.view(1, 1), state.target_cache) for _, token in fed])[0]
        run = LowerRun(len(self.exit_states), torch.cat(self.exit_states), self.split)      # states [rows, H]
        return CandidateTree(tree.tokens, tree.parents, tree.draft_probs, tree.siblings, lower_run=run)

    def _exit_logits(self, token: torch.Tensor, cache) -> torch.Tensor:
        """[V] the early-exit logits after `token` [1, 1], the next row of the chain: its layers < E run
        on the target's cache (their KV written there), its exit state kept for the verify."""
        position = self.prefix_len + len(self.exit_states)
        positions = torch.full((1, 1), position, dtype=torch.long, device=token.device)
        states = self.split.lower(token, positions, cache)                                          # [1, H]
        self.exit_states.append(states)
        return self.fit_vocab(self.split.head(states))[-1]

    def observe(self, state: DecodeState, result: StepResult) -> None:
        if not self.sharing:
            return super().observe(state, result)
        # the verify committed the accepted rows in every layer of the target's cache: nothing to keep here
        self.fed_nodes, self.exit_states = [], []
        if self.adaptive:
            self._adapt(result.num_accepted, result.tree.num_nodes)


def from_config(cfg, target, tokenizer, device, dtype) -> EarlyExit:
    e = cfg.early_exit
    return EarlyExit(e.exit_layer, num_tokens=e.num_tokens, branching=list(e.branching) if e.branching else None,
                     max_nodes=e.max_nodes, adaptive=e.adaptive, min_tokens=e.min_tokens, max_tokens=e.max_tokens,
                     draft_cost=e.draft_cost, min_confidence=e.min_confidence, batch_rows=e.batch_rows,
                     reuse_kv=e.reuse_kv)
