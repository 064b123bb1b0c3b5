"""Exact output laws by enumeration, for the lossless tests.

`enumerate_law(fn)` runs `fn(rng)` once per possible sequence of random outcomes, where `rng` has
the interface of specdec.sampling.TorchRandom (bernoulli(p), categorical(probs)), and returns the
exact probability of each value `fn` returns. Target "models" here are conditional tables:
`target_dist(context: tuple[int, ...]) -> probs [V]`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch


class _Branch(Exception):
    def __init__(self, options):
        self.options = options


class _Replay:
    """Replays a script of earlier choices; a choice beyond the script raises _Branch."""

    def __init__(self, script):
        self.script = script
        self.pos = 0
        self.weight = 1.0

    def _next(self, options):
        if self.pos < len(self.script):
            value, prob = self.script[self.pos]
            self.pos += 1
            self.weight *= prob
            return value
        raise _Branch(options)

    def bernoulli(self, prob) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        return self._next([(True, prob), (False, 1.0 - prob)])

    def categorical(self, probs: torch.Tensor) -> int:
        probs = probs.double() / probs.double().sum()
        return self._next([(k, float(p)) for k, p in enumerate(probs.tolist()) if p > 0])

    def sample_without_replacement(self, probs: torch.Tensor, k: int) -> list[int]:
        """Up to k successive draws, each from probs with the earlier draws removed (renormalized);
        fewer when fewer tokens have probability > 0 (as the strategies do)."""
        probs = probs.double().clone()
        drawn = []
        for _ in range(min(k, int((probs > 0).sum()))):
            token = self.categorical(probs)
            drawn.append(token)
            probs[token] = 0
        return drawn


def enumerate_law(fn: Callable) -> dict:
    law: dict = defaultdict(float)
    stack = [()]
    while stack:
        script = stack.pop()
        rng = _Replay(script)
        try:
            outcome = fn(rng)
        except _Branch as branch:
            for value, prob in branch.options:
                if prob > 0:
                    stack.append(script + ((value, prob),))
            continue
        law[outcome] += rng.weight
    return dict(law)


def random_table(vocab: int, seed: int, sharpness: float = 2.0) -> Callable:
    """A conditional distribution table over contexts, random but fixed by the seed."""
    cache: dict = {}

    def dist(context: tuple) -> torch.Tensor:
        if context not in cache:
            g = torch.Generator().manual_seed(hash((seed,) + tuple(context)) % (2 ** 31))
            cache[context] = torch.softmax(sharpness * torch.randn(vocab, generator=g, dtype=torch.float64), -1)
        return cache[context]

    return dist


def sequence_law(dist: Callable, length: int, prefix: tuple = ()) -> dict:
    """Exact law of `length` tokens sampled one by one from dist(prefix + tokens so far)."""
    law = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, p in law.items():
            probs = dist(prefix + seq)
            for k, q in enumerate(probs.tolist()):
                if q > 0:
                    nxt[seq + (k,)] = nxt.get(seq + (k,), 0.0) + p * q
        law = nxt
    return law


def extend_to_length(emission_law: dict, dist: Callable, length: int) -> dict:
    """Law of emitted sequences completed (or cut) to `length` tokens by sampling the rest from
    dist: equals sequence_law(dist, length) exactly when the emission is lossless."""
    law: dict = defaultdict(float)
    for emitted, p in emission_law.items():
        emitted = tuple(emitted)
        if len(emitted) >= length:
            law[emitted[:length]] += p
            continue
        for rest, q in sequence_law(lambda ctx: dist(ctx), length - len(emitted), emitted).items():
            law[emitted + rest] += p * q
    return dict(law)


def total_variation(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def always_accept(tree, target_probs: torch.Tensor, rng):
    """A deliberately wrong verifier (the negative control): keeps the first child at every depth."""
    from specdec.acceptance import Verdict
    accepted, node = [], -1
    while tree.children(node):
        node = tree.children(node)[0]
        accepted.append(node)
    return Verdict(tuple(accepted), rng.categorical(target_probs[node + 1]))
