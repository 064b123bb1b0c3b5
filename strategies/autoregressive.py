"""autoregressive: proposes nothing, so the loop is plain decoding (the fair baseline)."""
from __future__ import annotations

from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult

from .base import BaseStrategy


class Autoregressive(BaseStrategy):
    name = "autoregressive"
    needs_hidden_states = False

    def __init__(self):
        self.device = "cpu"

    def bind(self, target, tokenizer) -> None:
        self.device = target.device

    def reset(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState) -> CandidateTree:
        return CandidateTree.empty(self.device)

    def observe(self, state: DecodeState, result: StepResult) -> None:
        pass


def from_config(cfg, target, tokenizer, device, dtype) -> Autoregressive:
    return Autoregressive()
