"""Shadow tokens (DEL, Zarch et al. 2025): what each exit layer of the target would have drafted, read
from the target's own verify forwards, and the exit layer that this makes pay most.

At a committed row, the target's hidden state after layer E, through its final norm and lm_head, gives
the token an early exit at E would have drafted there: layer E's shadow token. It "would have been
accepted" where it equals the token the target committed next. A greedy chain drafted at E keeps its
next token exactly where that token is the one the target commits, so the share of committed rows whose
shadow token matches estimates the per-token acceptance of a chain drafted at E, for every E at once,
whichever E drafted.

`ShadowCounts` keeps the matches per exit layer on the device (adding a step's costs no host read) and
the committed rows counted on the host (the host knows them); `acceptance()` reads the matches back, once
per choice. `best_exit` then picks the exit layer whose chain gives the most expected new tokens per
target-forward time (strategies/draft_model.chain_rate), with a draft forward at E / L of a target forward.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Sequence

import torch

from .draft_model import chain_rate

YOUNG_ROWS = 256     # committed rows counted below which every step computes shadow tokens (then every Nth)
COUNT_CAP = 4096     # rows past which the counts halve, so that the estimate follows what the target decodes now


def shadow_matches(hidden: torch.Tensor, committed: torch.Tensor, head: "ShadowHead") -> torch.Tensor:
    """[X] per exit layer, the rows whose shadow token equals the committed one, on the device.
    hidden [R, X * H]: each committed row's hidden states after the X exit layers counted, side by side
    (the verifier's features of those layers); committed [R]: the token the target committed after each
    row; head: the target's final norm then lm_head."""
    states = hidden.view(hidden.shape[0], -1, head.width)                                       # [R, X, H]
    shadow = head(states).argmax(dim=-1)                                                        # [R, X]
    return (shadow == committed.to(shadow.device)[:, None]).sum(dim=0)                          # [X]


class ShadowHead:
    """The target's final norm, then its lm_head: what turns a hidden state after any layer into that
    layer's early-exit logits (the early-exit view's own head)."""

    def __init__(self, norm: torch.nn.Module, lm_head: torch.nn.Module):
        self.norm, self.lm_head = norm, lm_head
        self.width = lm_head.weight.shape[-1]

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(states))           # [..., V]


class ShadowCounts:
    """Per exit layer 1 .. L - 1: committed rows whose shadow token matched (on the device) out of the
    rows counted (on the host). Shared by every call of one strategy (its per-call copies), under a lock."""

    def __init__(self, exits: int, device: torch.device | str):
        self.matches = torch.zeros(exits, device=device)   # [L - 1] float: exit layer E at index E - 1
        self.rows = 0.0
        self.lock = threading.Lock()
        self.added = 0                          # steps added so far: what the last read is checked against
        self.last_read: tuple[int, list[float]] | None = None   # (added, acceptance) at the last read

    @property
    def young(self) -> bool:
        return self.rows < YOUNG_ROWS

    def add(self, matches: torch.Tensor, rows: int) -> None:
        """A step's matches [L - 1] (shadow_matches) over its `rows` committed rows."""
        with self.lock:
            self.matches += matches
            self.rows += rows
            self.added += 1
            if self.rows > COUNT_CAP:
                self.matches *= 0.5
                self.rows *= 0.5

    def acceptance(self) -> list[float]:
        """Smoothed per-layer acceptance, (matches + 1) / (rows + 2), exit layer E at index E - 1: one host read,
        made again only after a step was added (auto prices its drafter by it on every step; most add nothing)."""
        with self.lock:
            if self.last_read is None or self.last_read[0] != self.added:
                self.last_read = (self.added, ((self.matches + 1) / (self.rows + 2)).tolist())
            return list(self.last_read[1])


def best_exit(acceptance: Sequence[float], num_layers: int, lengths: Iterable[int],
              draft_cost: Callable[[int], float] | None = None) -> int:
    """The exit layer E in 1 .. L - 1 whose chain, at its best length among `lengths`, gives the most
    expected new tokens per target-forward time, at acceptance[E - 1] per token and `draft_cost(E)`
    target forwards per draft forward (default E / L, the share of the layers it runs). Ties: the lower E."""
    cost = draft_cost or (lambda exit_layer: exit_layer / num_layers)
    lengths = list(lengths)

    def rate(exit_layer: int) -> float:
        return max(chain_rate(acceptance[exit_layer - 1], cost(exit_layer), length) for length in lengths)

    return max(range(1, num_layers), key=rate)
