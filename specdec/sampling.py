"""Sampling settings and the one warp (temperature, top-k, top-p) applied alike to target and
draft logits. Probabilities are always fp32, whatever the model's dtype."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from .arguments import check_temperature, check_top_k, check_top_p


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy (argmax), not a tiny temperature
    top_k: int = 0             # 0 = off
    top_p: float = 1.0         # 1.0 = off

    def __post_init__(self):
        # checked and normalised to Python numbers: InputError names a bad value and what is valid
        object.__setattr__(self, "temperature", check_temperature(self.temperature))
        object.__setattr__(self, "top_k", check_top_k(self.top_k))
        object.__setattr__(self, "top_p", check_top_p(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (Hugging Face's order) on [..., V] logits, fp32."""
    logits = logits.float()
    if params.temperature not in (0, 1):
        logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]      # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)                    # ascending
        drop_sorted = cum <= (1 - params.top_p)
        drop_sorted[..., -1] = False                                          # keep the top token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities of the warped distribution."""
    return torch.softmax(warp_logits(logits, params), dim=-1)


class TorchRandom:
    """The one random source of a call: every random draw of drafting and acceptance (Bernoulli
    trials and their uniforms, categorical draws, draws without replacement) goes through it, from an explicit
    torch.Generator. The loop makes one per call (DecodeState.rng); tests substitute a source that
    enumerates every outcome (tests/law.py), so the whole generation's law can be computed."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def uniforms(self, n: int) -> torch.Tensor:
        """[n] uniforms in [0, 1) for up to n coming Bernoulli trials, drawn in one call on the
        generator's device: the caller brings them to the host with its own values (one read for
        the whole step) and hands them back one by one, bernoulli(prob, uniform)."""
        return torch.rand(n, generator=self.generator, device=self.generator.device)

    def bernoulli(self, prob: torch.Tensor | float, uniform: float | None = None) -> bool:
        """True with probability prob. `uniform`: a value from uniforms(), already on the host;
        None draws one here (a host read when prob or the draw is a device tensor)."""
        if uniform is None:
            uniform = torch.rand((), generator=self.generator, device=self.generator.device)
        return bool(uniform < prob)

    def categorical(self, probs: torch.Tensor) -> int:
        return int(self.draw(probs))

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """[1] long, one token drawn from probs [V] (weights >= 0, not all 0; normalized or not), left where
        probs are (categorical's draw without its read back: acceptance keeps it on the device as the next
        pending input, a batch reads all its rows' at once): inverse_cdf_draw."""
        return inverse_cdf_draw(probs, self.generator)

    def draw_without_replacement(self, probs: torch.Tensor, count: int) -> torch.Tensor:
        """[count] distinct tokens of probs [V], each drawn with the earlier ones removed
        (renormalized), left on the device (no read back): for count >= 2 the draw
        torch.multinomial(replacement=False) makes; one token is `draw`'s draw (the same law, at a
        fraction of the race's cost). The caller guarantees count <= the tokens of probability > 0."""
        if count == 1:
            return self.draw(probs)
        return exponential_race(probs, count, self.generator)


def inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[1] one token of the weights probs [V]: one uniform scaled to their total, searched in their
    cumulative sum (float64, so that a token's share of [0, total) is its weight to about 1e-16).
    torch.multinomial draws the same law but costs several times more on a CPU
    (benchmarks/results/batch/README.md), and a batch draws once per row and level of every step."""
    uniform = torch.rand(1, dtype=torch.float64, generator=generator, device=generator.device)
    return inverse_cdf_token(probs, uniform.to(probs.device))


def inverse_cdf_token(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """[1] the token of the weights probs [V] at `uniform` [1] (float64, in [0, 1)): the first token whose
    cumulative weight passes uniform * total. A token of weight 0 is never it."""
    cdf = probs.double().cumsum(-1)                                                       # [V]
    total = cdf[-1:]                                                                      # [1]
    token = torch.searchsorted(cdf, uniform * total, right=True)
    # uniform * total < total, but a rounding (uniform within 2 ** -53 of 1) may reach it: the last token of weight > 0
    return torch.minimum(token, torch.searchsorted(cdf, total))


def exponential_race(probs: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """The top `count` of probs / E, E ~ Exp(1) per token: `count` successive draws without
    replacement (the Gumbel-top-k trick in exponential form). It is the algorithm of
    torch.multinomial(replacement=False) step for step - same generator use, same tokens - minus
    its argument checks, which read values back to the host (a device sync on a GPU)."""
    return race_winners(probs, torch.empty_like(probs).exponential_(1, generator=generator), count)


def race_winners(probs: torch.Tensor, noise: torch.Tensor, count: int) -> torch.Tensor:
    """[count] the tokens of the largest probs / noise [V], largest first: the exponential race
    run on the noise `noise` (exponential_race's draw; tests/law.py hands it a noise of each
    outcome it enumerates)."""
    race = probs / noise                                                             # [V]
    if count == 1:
        return race.argmax(dim=-1, keepdim=True)
    return race.topk(count).indices


def resolve_seed(seed: int | None) -> int:
    """The seed a call samples with: `seed` itself, or for None a fresh one from the OS's entropy.
    A call resolves it once and hands the same number to its generator and to the coupled noise,
    and reports it (Stats.seed), so passing it back as seed= reproduces the sample. 63 bits: any
    seed arguments.check_seed accepts and torch's manual_seed take."""
    return secrets.randbits(63) if seed is None else int(seed)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded with resolve_seed(seed)."""
    return torch.Generator(device=device).manual_seed(resolve_seed(seed))
