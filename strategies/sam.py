"""sam: SAM-Decoding's rule (Hu et al. 2024), the baseline auto's mix of lookup and token recycling
must beat: copy from a long suffix match of the context, else draft from the recycling table.

Each step, when the context's last `min_match` tokens or more occurred before in the prompt and
output (prompt lookup with min_ngram = min_match), their continuations are the tree; otherwise
token_recycling's table tree is. The table learns from every step whichever part drafted (every row
of every forward: token recycling's update), and the lookup index from every committed token. Both
parts are configured by their own sections (prompt_lookup:, token_recycling:); min_match is this
rule's own.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.config import setting
from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy
from .prompt_lookup import PromptLookup
from .token_recycling import TokenRecycling


@dataclass
class SamConfig:
    """The `sam:` section: how long a suffix match must be to copy from it (SAM-Decoding: 5)."""
    min_match: int = setting(5, min=1)


CONFIG_SECTIONS = {"sam": SamConfig}


class Sam(BaseStrategy):
    name = "sam"
    needs_hidden_states = False

    def __init__(self, lookup: PromptLookup, recycling: TokenRecycling):
        self.lookup, self.recycling = lookup, recycling
        self.top_k_ids = recycling.top_k_ids          # the table learns from every step
        self.max_nodes = max(lookup.max_nodes, recycling.max_nodes)
        self.copied: list[bool] = []                  # per step of the current call: drafted by copying

    def for_call(self) -> "Sam":
        twin = super().for_call()
        twin.lookup, twin.recycling = self.lookup.for_call(), self.recycling.for_call()
        return twin

    def use_compiled_verifier(self, compiled: bool) -> None:
        self.recycling.use_compiled_verifier(compiled)

    def use_row_linear(self, rows: int) -> None:
        self.recycling.use_row_linear(rows)

    def profile_setup(self, target):
        return self.recycling.profile_setup(target)

    def use_costs(self, profile) -> None:
        self.recycling.use_costs(profile)

    def bind(self, target, tokenizer) -> None:
        self.lookup.bind(target, tokenizer)
        self.recycling.bind(target, tokenizer)

    def reset(self, state: DecodeState) -> None:
        self.lookup.reset(state)
        self.recycling.reset(state)
        self.copied = []

    def propose(self, state: DecodeState) -> CandidateTree:
        paths = self.lookup.propose_paths(state)
        self.copied.append(bool(paths))
        if paths:
            return CandidateTree.from_paths(paths, device=self.recycling.device, max_nodes=self.lookup.max_nodes)
        return self.recycling.propose(state)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        self.lookup.observe(state, result)
        self.recycling.observe(state, result)

    def finish(self, state: DecodeState) -> None:
        self.recycling.finish(state)

    def forget(self) -> None:
        self.recycling.forget()

    def prepare_batches(self, max_rows: int) -> None:
        self.recycling.prepare_batches(max_rows)


def from_config(cfg, target, tokenizer, device, dtype) -> Sam:
    from . import token_recycling
    c, min_match = cfg.prompt_lookup, cfg.sam.min_match
    lookup = PromptLookup(min_ngram=min_match, max_ngram=max(min_match, c.max_ngram), num_tokens=c.num_tokens,
                          max_matches=c.max_matches, max_nodes=c.max_nodes)
    return Sam(lookup, token_recycling.from_config(cfg, target, tokenizer, device, dtype))
