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

The exit layer chosen from shadow tokens (`auto`, as layer_skip's `auto` chooses its set;
strategies/shadow.py): on some verify steps the strategy asks for the target's hidden states after every
layer 1 .. L - 1 at the committed rows, counts where each layer's shadow token equals the token committed
next, and picks the E whose chain gives the most expected new tokens per target-forward time (a draft
forward at E / L). It switches where the switch needs nothing rebuilt: at the start of each call (a batch
row: when it starts), and, drafting on the target's own cache, after any step where it chooses again (the
target's cache holds every layer of the committed text, so a new E finds its layers < E there). A draft
cache of its own holds layers < E only: a new E there waits for the next call. A step that asks for
hidden states verifies without the KV reuse (the verifier's parts give logits only), so shadow tokens are
computed on every step while the counts are young, then on one step in `every`; the counts stay on the
device and are read back once per choice.

Inside `auto` (price_calls) the same counts price each call before it is made (expected_call): the shadow
acceptance at its exit layer (the best one with `auto`) is what a greedy chain drafted there would keep, so
auto leaves the drafter uncalled where even that loses to lookup alone. The counts come from every step
auto verifies, the drafter called or not: a drafter that loses is never called once they are in, and auto
waits for them (a few steps) rather than call it to find out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional

from torch import nn

import torch

from specdec.cache import commit_rows
from specdec.config import setting
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.tree import CandidateTree, LowerRun, host_to_device
from specdec.types import DecodeState, StepResult

from .base import ExpectedCall
from .draft_model import DraftConfig, DraftModel, ViewDraftConfig, chain_rate, chains
from .exit_split import SplitTarget, final_norm
# the views, read from here too by the tests and scripts/measure
from .layer_views import _check_runs_its_layers, decoder_layers, exit_view, num_layers, part_view  # noqa: F401
from .shadow import ShadowCounts, ShadowHead, best_exit, shadow_matches

log = logging.getLogger(__name__)

CHOOSE_ROWS = 32      # committed rows counted before auto first moves E from exit_layer
PRICING_ROWS = 64     # as auto's drafter: committed rows counted on every step, then one step in `every` (each
#                       counted step runs the lm_head once more a row, per exit layer counted; pricing a call needs
#                       the acceptance roughly, and the later counts keep refining it)


@dataclass
class EarlyExitConfig(ViewDraftConfig):
    """The `early_exit:` section. The drafting settings mean what the `draft:` section's do."""
    exit_layer: int = setting(1, min=1)     # E: draft with the target's first E decoder layers (1 .. L - 1)
    reuse_kv: bool = True                   # chains of one sequence draft on the target's own KV cache: the verify
    #                                         runs layers < E only for the last drafted token (LayerSkip); false:
    #                                         the draft keeps a cache of its own (trees and batches always do)
    auto: bool = False                      # choose E (1 .. L - 1) while generating, from shadow tokens (what each
    #                                         layer would have drafted at the committed rows); exit_layer: the start
    every: int = setting(8, min=1)          # auto, or as auto's drafter (which prices its calls by them): shadow tokens
    #                                         on every verify step while the counts are young, then on one step in
    #                                         `every` (after which, with auto, E may switch mid-call)


CONFIG_SECTIONS = {"early_exit": EarlyExitConfig}


class EarlyExit(DraftModel):
    """A DraftModel whose draft is exit_view(target, exit_layer), made at bind. With reuse_kv, a chain
    of one sequence drafts on the target's own cache instead (see the module's docstring)."""
    name = "early_exit"

    counted_layers: tuple[int, ...] = ()      # the exit layers whose shadow tokens it counts (bind), in counts' order

    def __init__(self, exit_layer: int = EarlyExitConfig.exit_layer, *, num_tokens: int = EarlyExitConfig.num_tokens,
                 branching: List[int] | None = EarlyExitConfig.branching, max_nodes: int = EarlyExitConfig.max_nodes,
                 adaptive: bool = EarlyExitConfig.adaptive, min_tokens: int = EarlyExitConfig.min_tokens,
                 max_tokens: int = EarlyExitConfig.max_tokens, draft_cost: float | None = EarlyExitConfig.draft_cost,
                 min_confidence: float = EarlyExitConfig.min_confidence,
                 batch_rows: bool = EarlyExitConfig.batch_rows, reuse_kv: bool = EarlyExitConfig.reuse_kv,
                 auto: bool = EarlyExitConfig.auto, every: int = EarlyExitConfig.every):
        if int(exit_layer) < 1:
            raise ConfigError(f"early_exit.exit_layer must be >= 1 (the decoder layers the draft runs), got {exit_layer}")
        if auto and draft_cost is not None:
            raise ConfigError(f"early_exit.draft_cost={draft_cost} prices one fixed exit layer, but early_exit.auto "
                              f"prices each exit layer E at E / L of a target forward: leave draft_cost unset (null)")
        if int(every) < 1:
            raise ConfigError(f"early_exit.every must be >= 1 (one verify step in this many), got {every}")
        super().__init__(None, num_tokens=num_tokens, branching=branching, max_nodes=max_nodes, adaptive=adaptive,
                         min_tokens=min_tokens, max_tokens=max_tokens,
                         draft_cost=DraftConfig.draft_cost if draft_cost is None else draft_cost,
                         min_confidence=min_confidence, batch_rows=batch_rows,
                         lean_forward=False)   # its view of the target keeps the model's own forward
        self.exit_layer = int(exit_layer)
        self.given_draft_cost = draft_cost
        self.reuse_kv = bool(reuse_kv)
        self.split = None              # the target in two parts over its cache (SplitTarget), where reuse applies
        self.reuse_off = "early_exit.reuse_kv is false" if not self.reuse_kv else None   # why not, where it does not
        self.auto = bool(auto)
        self.every = int(every)
        # per exit layer, made once at first use and shared by the per-call copies: its view, and its
        # SplitTarget (or the reason the reuse is off there)
        self.views: dict[int, nn.Module] = {}
        self.splits: dict[int, SplitTarget | str] = {}
        self.needs_hidden_states = False      # true for the verify of a step that counts shadow tokens
        self.priced = False                   # price_calls: a strategy around it (auto) calls it where a call pays
        self.counts_arrive = True             # this call's steps that asked for hidden states got them (reset)

    def bind(self, target, tokenizer) -> None:
        self.target, self.layers = target, num_layers(target)
        self.use_draft(self._view(self.exit_layer))
        if self.given_draft_cost is None:
            self.draft_cost = self.exit_layer / self.layers
        super().bind(target, tokenizer)
        if self.counting:
            _, norm = final_norm(target, decoder_layers(target), "early_exit.auto")
            self.shadow_head = ShadowHead(norm, target.get_output_embeddings())
            # choosing E: every exit layer's counts; pricing one fixed E: its own alone (a seventh of the head's work
            # on an 8-layer target), as E stays fixed
            self.counted_layers = tuple(range(1, self.layers)) if self.auto else (self.exit_layer,)
            self.counts = ShadowCounts(len(self.counted_layers), target.device)
            self.feature_layers = self.counted_layers                # hidden states after those layers
        if self.reuse_kv:
            self._split_target(self.exit_layer)

    def _view(self, exit_layer: int) -> nn.Module:
        if exit_layer not in self.views:
            self.views[exit_layer] = exit_view(self.target, exit_layer)
        return self.views[exit_layer]

    def _split_target(self, exit_layer: int) -> None:
        """Set `split` where the KV reuse applies to this target, shape and exit layer, else say why in `reuse_off`."""
        if self.branching is not None:
            self.reuse_off = "trees draft on a KV cache of their own (the reuse covers chains)"
            log.info("early_exit: %s", self.reuse_off)
            return
        if exit_layer not in self.splits:
            try:
                split = SplitTarget(self.target, exit_layer)
                split.check()
                self.splits[exit_layer] = split
            except IncompatibleModelsError as exc:
                self.splits[exit_layer] = str(exc)
                log.warning("%s; drafting on a KV cache of its own instead", exc)
        found = self.splits[exit_layer]
        self.split, self.reuse_off = (found, None) if isinstance(found, SplitTarget) else (None, found)

    # ------------------------------------------------------------------ the exit layer from shadow tokens
    @property
    def counting(self) -> bool:
        """Whether it counts shadow tokens: to choose its exit layer (auto), or to price its calls (priced)."""
        return self.auto or self.priced

    def price_calls(self) -> None:
        self.priced = True

    def expected_call(self, state: DecodeState) -> ExpectedCall | None:
        """A greedy chain's call, priced from the shadow counts: at the exit layer it drafts at (the one the
        counts make pay most, with auto), each token kept with that layer's shadow acceptance, at the chain
        length that pays most there. Not yet known while the counts are few and still arriving; None where
        they cannot say: a tree (its siblings keep what a shadow token misses), sampling (a shadow token is
        an argmax), or a call whose steps give no hidden states (a batch's)."""
        if not self.priced or self.branching is not None or not state.sampling.greedy:
            return None
        if self.counts.rows < CHOOSE_ROWS:
            if not self.counts_arrive:
                return None
            return ExpectedCall(None, self.draft_cost * min(self.num_tokens, state.max_depth))
        acceptance = self.counts.acceptance()                  # a host read where a step was counted since
        lengths = self.chain_lengths()
        exit_layer = best_exit(acceptance, self.layers, lengths) if self.auto else self.exit_layer
        cost = exit_layer / self.layers if self.auto else self.draft_cost
        kept = acceptance[self.counted_layers.index(exit_layer)]
        length = min(max(lengths, key=lambda g: chain_rate(kept, cost, g)), state.max_depth)
        return ExpectedCall((kept,) * length, cost * length)

    def _use_exit(self, exit_layer: int) -> None:
        """Draft at `exit_layer` from now: its view, its draft cost and (where the reuse applies) its split."""
        self.exit_layer = exit_layer
        self.use_draft(self._view(exit_layer))
        self.draft_cost = exit_layer / self.layers
        if self.reuse_kv:
            self._split_target(exit_layer)

    def _choice(self) -> int:
        """The exit layer the counts make pay most (one host read); the current one while they are few."""
        if self.counts.rows < CHOOSE_ROWS:
            return self.exit_layer
        return best_exit(self.counts.acceptance(), self.layers, self.chain_lengths())

    @torch.inference_mode()
    def _count_shadows(self, state: DecodeState, result: StepResult) -> None:
        """Add this step's shadow matches at its committed rows (pending + accepted), where it asked for them.
        Inside auto a step comes in parts (drafter_steps), each with its own rows: the token after each row."""
        if result.hidden is None:           # a step that did not ask, or a forward that gives none (a batch's)
            if self.needs_hidden_states:
                self.counts_arrive = False  # asked and got none: this call's steps cannot price its calls
            return
        before = result.committed_before
        committed = host_to_device(state.token_ids[before: before + len(result.hidden)], result.hidden.device)  # [R]
        self.counts.add(shadow_matches(result.hidden, committed, self.shadow_head), len(committed))

    def _next_step(self, state: DecodeState) -> None:
        """Whether the coming verify step counts shadow tokens (asks for the hidden states): every step while
        the counts are young, then one in `every`; with auto, after that step E may be chosen again. Set at
        the start of a call and after each step, so it holds on the steps auto verifies without calling it.
        Pricing alone counts greedy steps only (a sampled step's committed token is no argmax)."""
        count = self.steps % self.every == 0
        self.choosing = self.auto and count
        young = self.counts.rows < PRICING_ROWS if self.priced else self.counts.young
        self.needs_hidden_states = (count or young) and (self.auto or state.sampling.greedy)
        self.steps += 1

    def _switch_mid_call(self) -> None:
        """Drafting on the target's cache, after a step that chose again: move to the chosen E where its split works."""
        exit_layer = self._choice()
        if exit_layer != self.exit_layer:
            self._split_target(exit_layer)
            if self.split is None:           # its parts fail the probe: stay at the E whose parts work
                self._split_target(self.exit_layer)
                return
            self._use_exit(exit_layer)

    def reset(self, state: DecodeState) -> None:
        self.needs_hidden_states = False
        self.steps = 0                        # verify steps of this call (which of them count shadow tokens)
        self.choosing = False
        self.counts_arrive = True             # every step that asked for hidden states got them (a batch's: none)
        if self.auto:
            self._use_exit(self._choice())
        super().reset(state)
        # one sequence on the eager verifier: draft on the target's cache; a batch row, or under compile, on its own
        self.sharing = self.split is not None and state.target_cache is not None
        self.exit_states: list[torch.Tensor] = []      # per fed row: [1, H] its exit state (sharing)
        if self.counting:
            self._next_step(state)

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
        if self.counting:
            self._count_shadows(state, result)
        # the verify step's last part (auto hands a step over in parts: drafter_steps)
        ends = result.committed_before + result.num_accepted + 1 >= len(state.token_ids)
        if not self.sharing:
            super().observe(state, result)
        else:
            # the verify committed the accepted rows in every layer of the target's cache: nothing to keep here
            self.fed_nodes, self.exit_states = [], []
            if self.adaptive:
                self._adapt(result.num_accepted, result.num_verified)
            if self.auto and self.choosing and ends:
                self._switch_mid_call()
        if self.counting and ends:
            self._next_step(state)

    def finish(self, state: DecodeState) -> None:
        self.needs_hidden_states = False      # the next call's prefill asks for no features

    def drafting_modules(self) -> list[torch.nn.Module]:
        """The view, and where the KV reuse applies what drafting runs instead: each split's lower part
        (which also runs the verify's last drafted row) and its head (the target's final norm and lm_head)."""
        own = [module for module in super().drafting_modules() if module is not self.target]
        return own + [module for split in self._built_splits() for module in (split.lower_model, split.norm,
                                                                                split.lm_head)]

    def verifying_modules(self) -> list[torch.nn.Module]:
        """Each split's upper part: the verify runs the target's layers >= E through it."""
        return [split.upper for split in self._built_splits()]

    def _built_splits(self) -> list[SplitTarget]:
        return [split for split in self.splits.values() if isinstance(split, SplitTarget)]


def from_config(cfg, target, tokenizer, device, dtype) -> EarlyExit:
    e = cfg.early_exit
    return EarlyExit(e.exit_layer, num_tokens=e.num_tokens, branching=list(e.branching) if e.branching else None,
                     max_nodes=e.max_nodes, adaptive=e.adaptive, min_tokens=e.min_tokens, max_tokens=e.max_tokens,
                     draft_cost=e.draft_cost, min_confidence=e.min_confidence, batch_rows=e.batch_rows,
                     reuse_kv=e.reuse_kv, auto=e.auto, every=e.every)
