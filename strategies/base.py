"""The one protocol every drafting strategy follows. No strategy bends these signatures."""
from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult


@runtime_checkable
class Strategy(Protocol):
    name: str
    needs_hidden_states: bool   # ask the verifier for the target's last hidden states

    def bind(self, target, tokenizer) -> None:
        """Called once with the target model and tokenizer: check compatibility, move to its device."""

    def reset(self, state: DecodeState) -> None:
        """A new generation starts: state.token_ids is the prompt (its last token pending)."""

    def propose(self, state: DecodeState) -> CandidateTree:
        """Candidate tokens after the pending token; CandidateTree.empty() for none.
        At most state.max_depth levels: a deeper tree is a strategy bug, and the loop raises
        StrategyError (specdec.loop.check_depth) rather than cut it behind the strategy's back."""

    def observe(self, state: DecodeState, result: StepResult) -> None:
        """The verdict of the last step; state.token_ids already holds the new tokens. Not called
        after the step a stop rule ends: a strategy that keeps something of a finished call (suffix)
        may define `finish(state)`, which the loop calls once then, with all the new tokens."""


def per_call(strategy):
    """The strategy object a call runs on when another call holds `strategy`: its `for_call()`
    where it defines one, else a shallow copy. A copy shares the models and settings; reset()
    then gives it per-call state of its own, so a strategy's reset() must assign fresh objects
    for everything a call changes (not clear shared ones in place). What a strategy means to
    share across calls (auto's calibration) stays shared by reference."""
    fork = getattr(strategy, "for_call", None)
    return fork() if callable(fork) else copy.copy(strategy)
