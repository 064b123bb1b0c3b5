"""Exact output laws by enumeration, for the lossless tests.

`enumerate_law(fn)` runs `fn(rng)` once per possible sequence of random outcomes, where `rng` has
the interface of specdec.sampling.TorchRandom (uniforms(n), bernoulli(p, uniform), categorical(probs),
draw(probs) - categorical's outcome as a device tensor, the branch acceptance takes -,
draw_without_replacement(probs, k)), and returns the exact probability of each value `fn` returns.
Target "models" here are conditional tables: `target_dist(context: tuple[int, ...]) -> probs [V]`.

The branches production takes are the ones enumerated:
* acceptance draws a step's uniforms up front (`uniforms(n)`) and hands them back one per trial,
  `bernoulli(prob, uniform)`. Here each uniform is a handle (its index, as the value) to an interval
  [lo, hi) of [0, 1) it is known to lie in; a trial splits it at prob (True: u < prob, as
  TorchRandom.bernoulli decides) with its exact conditional probability. Two trials on one uniform
  are therefore correlated here exactly as in production, and a point of the chosen side is checked
  against TorchRandom.bernoulli itself.
* the drafters' `draw_without_replacement` is the exponential race (specdec.sampling): the race's
  outcomes (which tokens finish first, in order) are enumerated with their probabilities - those of
  successive draws without replacement, the race's known law - and the production race
  (`race_winners`) runs on a noise of that outcome and must return those tokens, on probs' device.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch

from specdec import sampling
from specdec.sampling import TorchRandom

_PRODUCTION = TorchRandom(torch.Generator())      # its bernoulli(prob, uniform) decides as production does


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
        self.intervals: list[tuple[float, float]] = []     # uniform i lies in [lo, hi) (what its trials said)

    def _next(self, options):
        self.draws += 1
        if self.pos < len(self.script):
            value, prob = self.script[self.pos]
            self.pos += 1
            self.weight *= prob
            return value
        raise _Branch(options)

    def uniforms(self, n: int) -> torch.Tensor:
        """[n] handles of n fresh uniforms on [0, 1): their indices, as the values."""
        first = len(self.intervals)
        self.intervals += [(0.0, 1.0)] * n
        return torch.arange(first, first + n, dtype=torch.float64)

    def bernoulli(self, prob, uniform=None) -> bool:
        prob = float(prob)
        if prob != prob:
            raise LawError("bernoulli(NaN): an acceptance probability is NaN")
        if uniform is None:          # a draw of its own
            prob = min(max(prob, 0.0), 1.0)
            return self._next([(True, prob), (False, 1.0 - prob)])
        handle = int(uniform)
        if handle != uniform or not 0 <= handle < len(self.intervals):
            raise LawError(f"bernoulli(uniform={uniform}): not a handle uniforms() gave out")
        lo, hi = self.intervals[handle]
        below = min(max((prob - lo) / (hi - lo), 0.0), 1.0) if hi > lo else float(lo < prob)
        outcome = self._next([(True, below), (False, 1.0 - below)])
        lo, hi = (lo, min(hi, max(prob, lo))) if outcome else (max(lo, min(prob, hi)), hi)
        self.intervals[handle] = (lo, hi)
        if hi > lo and _PRODUCTION.bernoulli(prob, (lo + hi) / 2) != outcome:
            raise LawError(f"TorchRandom.bernoulli({prob}, {(lo + hi) / 2}) disagrees with the side it lies on")
        return outcome

    def categorical(self, probs: torch.Tensor) -> int:
        probs = probs.detach().cpu().double()
        total = float(probs.sum())
        if not total > 0 or bool(torch.isnan(probs).any()) or bool((probs < 0).any()):
            raise LawError(f"categorical over an impossible distribution {probs.tolist()}")
        probs = probs / total
        return self._next([(k, float(p)) for k, p in enumerate(probs.tolist()) if p > 0])

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """TorchRandom.draw: categorical's outcome as a [1] tensor where probs are."""
        return torch.tensor([self.categorical(probs)], dtype=torch.long, device=probs.device)

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
        """The exponential race of TorchRandom.draw_without_replacement: its outcome enumerated as
        successive draws, then production's race_winners run on a noise with that outcome."""
        drawn = self.sample_without_replacement(probs, count)
        if len(drawn) != count:
            raise LawError(f"draw_without_replacement of {count} from {int((probs > 0).sum())} possible tokens")
        finish = torch.ones_like(probs, dtype=torch.float64)                    # [V] probs / noise: the race
        finish[drawn] = torch.arange(count + 1, 1, -1, dtype=torch.float64)      # the drawn finish first, in order
        noise = torch.where(probs > 0, probs.double() / finish, torch.ones_like(finish)).to(probs.dtype)
        winners = sampling.race_winners(probs, noise, count)
        if winners.tolist() != drawn or winners.device != probs.device:
            raise LawError(f"race_winners gave {winners.tolist()} on {winners.device} for a noise where {drawn} "
                           f"finish first")
        return winners


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
    enumerated. Marginalize with `token_law`. `speculator` may also be a function making a fresh
    one per run: a strategy that learns across calls (auto's calibration) must start each replayed
    run from the same state."""
    from unittest import mock
    current = []

    def run(rng):
        current[:] = [rng]
        sd = speculator() if callable(speculator) and not hasattr(speculator, "generate") else speculator
        out = sd.generate(prompt, max_new_tokens=max_new_tokens, temperature=params.temperature,
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
            logits = model(torch.tensor([list(prompt) + list(context)], device=model.device)).logits[0, -1]   # [V]
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


def always_accept(tree, target_probs: torch.Tensor, rng, tree_tokens=None, tables=None):
    """A deliberately wrong verifier (the negative control): keeps the first child at every depth."""
    from specdec.acceptance import Verdict
    accepted, node = [], -1
    while tree.children(node):
        node = tree.children(node)[0]
        accepted.append(node)
    return Verdict(tuple(accepted), rng.categorical(target_probs[node + 1]))
