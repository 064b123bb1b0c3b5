"""Exact output laws by enumeration, for the lossless tests.

`enumerate_law(fn)` runs `fn(rng)` once per possible sequence of random outcomes, where `rng` has
the interface of specdec.sampling.TorchRandom (uniforms(n), bernoulli(p), categorical(probs)), and returns the
exact probability of each value `fn` returns. Target "models" here are conditional tables:
`target_dist(context: tuple[int, ...]) -> probs [V]`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch


class LawError(AssertionError):
    """The code under test asked the random source for an impossible draw (NaN or all-zero)."""


class _Branch(Exception):
    def __init__(self, options):
        self.options = options


class _Replay:
    """Replays a script of earlier choices; a choice beyond the script raises _Branch."""

    def __init__(self, script):
        self.script = script
        self.pos = 0
        self.weight = 1.0
        self.draws = 0            # how many random draws the run made

    def _next(self, options):
        self.draws += 1
        if self.pos < len(self.script):
            value, prob = self.script[self.pos]
            self.pos += 1
            self.weight *= prob
            return value
        raise _Branch(options)

    def uniforms(self, n: int) -> None:
        """TorchRandom draws a step's uniforms up front; here every trial is enumerated instead."""
        return None

    def bernoulli(self, prob, uniform=None) -> bool:
        prob = float(prob)
        if prob != prob:
            raise LawError("bernoulli(NaN): an acceptance probability is NaN")
        prob = min(max(prob, 0.0), 1.0)
        return self._next([(True, prob), (False, 1.0 - prob)])

    def categorical(self, probs: torch.Tensor) -> int:
        probs = probs.detach().cpu().double()
        total = float(probs.sum())
        if not total > 0 or bool(torch.isnan(probs).any()) or bool((probs < 0).any()):
            raise LawError(f"categorical over an impossible distribution {probs.tolist()}")
        probs = probs / total
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

    def draw_without_replacement(self, probs: torch.Tensor, count: int) -> torch.Tensor:
        """sample_without_replacement's draws as a tensor on probs' device (the drafters' form)."""
        return torch.tensor(self.sample_without_replacement(probs, count), dtype=torch.long, device=probs.device)


def enumerate_law(fn: Callable, explore_zero: bool = False) -> dict:
    """{outcome: exact probability} of fn(rng) over every sequence of random outcomes.
    explore_zero=True also runs the outcomes of probability zero (a Bernoulli trial's side of
    probability 0), with weight 0: code reachable only there must still run without error."""
    law: dict = defaultdict(float)
    stack = [()]
    while stack:
        script = stack.pop()
        rng = _Replay(script)
        try:
            outcome = fn(rng)
        except _Branch as branch:
            for value, prob in branch.options:
                if prob > 0 or explore_zero:
                    stack.append(script + ((value, prob),))
            continue
        law[outcome] += rng.weight
    return dict(law)


# ----------------------------------------------------------------------------- end to end
def generation_law(speculator, prompt: list[int], max_new_tokens: int, params, *,
                   explore_zero: bool = False) -> dict:
    """Exact law of (new tokens, accepted lengths per step) of speculator.generate(prompt, ...)
    under sampling `params` (EOS ignored): the real strategy, verifier and loop, every random draw
    enumerated. Marginalize with `token_law`."""
    from unittest import mock
    current = []

    def run(rng):
        current[:] = [rng]
        out = speculator.generate(prompt, max_new_tokens=max_new_tokens, temperature=params.temperature,
                                  top_k=params.top_k, top_p=params.top_p, ignore_eos=True)
        return tuple(out.token_ids), tuple(out.stats.accepted_lengths)

    with mock.patch("specdec.loop.TorchRandom", lambda generator: current[0]):
        return enumerate_law(run, explore_zero=explore_zero)


def token_law(law: dict) -> dict:
    """The law of the new tokens alone, from generation_law's joint law."""
    tokens: dict = defaultdict(float)
    for (seq, _accepted), p in law.items():
        tokens[seq] += p
    return dict(tokens)


@torch.inference_mode()
def model_dist(model, prompt: list[int], params) -> Callable:
    """The model's own conditional distributions after `prompt`, warped by `params` (what the
    target samples from), as a table: dist(context) -> probs [V] (float64)."""
    from specdec.sampling import logits_to_probs
    cache: dict = {}

    def dist(context: tuple) -> torch.Tensor:
        if context not in cache:
            logits = model(torch.tensor([list(prompt) + list(context)])).logits[0, -1]     # [V]
            cache[context] = logits_to_probs(logits, params).double()
        return cache[context]

    return dist


def laws_close(a: dict, b: dict, atol: float = 1e-5) -> bool:
    """Same support (up to atol) and every probability within atol."""
    keys = set(a) | set(b)
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) <= atol for k in keys)


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


def always_accept(tree, target_probs: torch.Tensor, rng, tree_tokens=None):
    """A deliberately wrong verifier (the negative control): keeps the first child at every depth."""
    from specdec.acceptance import Verdict
    accepted, node = [], -1
    while tree.children(node):
        node = tree.children(node)[0]
        accepted.append(node)
    return Verdict(tuple(accepted), rng.categorical(target_probs[node + 1]))
