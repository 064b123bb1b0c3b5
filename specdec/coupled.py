"""The coupled sampler: same seed, same text, whatever drafts the tree.

At every absolute position t of the sequence (0 = the first prompt token) the target's token is
the Gumbel-max sample

    x_t = argmax_x ( warped_logits_t(x) + g_t(x) ),    g_t(x) = -log(-log u(seed, t, x))

where warped_logits are the temperature / top-k / top-p filtered logits (the exact log-law of the
target's sampling distribution, up to a constant) and u is a counter-based uniform: a pure hash
of (seed, t, x), independent of how many random numbers were drawn before, of the device's RNG
state and of the device itself. Each x_t is an exact sample of the target's filtered
distribution (the Gumbel-max trick), with fresh noise per position, so the output law is the
target's own.

Because the token at t is a deterministic function of (prefix, seed, t), verification is the
greedy walk over these noisy argmaxes (specdec.acceptance.accept_greedy), and every strategy
reproduces `autoregressive`'s text token for token, exactly as greedy output does. Drafters
propose with the same noise: the top-k of (their own warped logits + g_t) at the position they
guess, which agrees with the target far more often than an independent draw
(`coupled_proposals`; any drafter - draft model, Medusa heads, EAGLE - calls it the same way).

Positions: with L committed tokens (the last one pending), a tree node at depth d (0 = child of
the pending token) holds position L + d; verifier row 0 (the pending token's) predicts position
L, and row i + 1 (node i) predicts position L + depth(i) + 1 (`tree_row_positions`).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .arguments import SAMPLERS
from .errors import InputError
from .sampling import SamplingParams, resolve_seed, warp_logits
from .tree import to_device

KEY_WINDOW = 64          # positions whose noise keys go to the device together (GumbelNoise)
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def check_sampler(sampler: str) -> str:
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise InputError(f"unknown sampler {sampler!r}; samplers: {', '.join(SAMPLERS)} (rejection: lossless "
                         f"rejection sampling, the default; coupled: Gumbel-max noise keyed by (seed, position), "
                         f"the same text for every strategy)")
    return sampler


# ---------------------------------------------------------------------- counter-based noise
def _splitmix64(x: int) -> int:
    """One splitmix64 step on a Python int (exact 64-bit arithmetic)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def position_key(seed: int, position: int) -> int:
    """A 64-bit key for (seed, position): two chained splitmix64 mixes."""
    return _splitmix64(_splitmix64(int(seed) & _M64) ^ (int(position) & _M64))


def _mul32(h: torch.Tensor, constant: int) -> torch.Tensor:
    """h * constant mod 2^32 for h in [0, 2^32) held in int64, without int64 overflow: the product
    is split in two 16-bit halves of the constant (each partial product < 2^48)."""
    high = (h * (constant >> 16)) & 0xFFFF
    return ((high << 16) + h * (constant & 0xFFFF)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """Murmur3's 32-bit finaliser (a bijection with full avalanche) on int64 tensors in [0, 2^32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniforms(seed: int, positions: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[P, V] float64 u(seed, t, x) strictly inside (0, 1): a pure function of its arguments."""
    return uniforms_from_keys([position_key(seed, t) for t in positions], vocab, device)


def uniforms_from_keys(keys: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[K, V] float64 uniforms in (0, 1), row i from the 64-bit key keys[i] (see position_key):
    per token two rounds of murmur3's finaliser keyed by the key's two halves, vectorised in
    int64 torch ops (bit-identical on every device)."""
    halves = torch.tensor([[k & _M32 for k in keys], [k >> 32 for k in keys]], dtype=torch.long).to(device)   # [2, K]
    return uniforms_from_halves(halves, vocab)


def uniforms_from_halves(halves: torch.Tensor, vocab: int) -> torch.Tensor:
    """uniforms_from_keys for keys already on the device as halves [2, K] (row 0 the low 32 bits,
    row 1 the high 32 bits), on their device."""
    device = halves.device
    key_low, key_high = halves[0][:, None], halves[1][:, None]                                    # [K, 1]
    tokens = torch.arange(vocab, dtype=torch.long, device=device)[None]                           # [1, V]
    h = _fmix32(tokens ^ key_low)                                                                 # [K, V]
    h = _fmix32((h + key_high) & _M32)                                                            # [K, V]
    return (h.double() + 0.5) / 2.0 ** 32                                                         # (0, 1)


def gumbel(seed: int, positions: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[P, V] fp32 standard Gumbel noise g_t(x) = -log(-log u(seed, t, x))."""
    return gumbel_from_keys([position_key(seed, t) for t in positions], vocab, device)


def gumbel_from_keys(keys: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[K, V] fp32 Gumbel noise, row i from keys[i] (many seeds at once, for tests and tools)."""
    return (-torch.log(-torch.log(uniforms_from_keys(keys, vocab, device)))).float()


class GumbelNoise:
    """The coupled sampler's randomness for one generation: g_t for any position t, computed once
    per position and kept while it may still be asked for. `sampling` is the warp the noise is
    added to (the same for target and drafts)."""

    def __init__(self, seed: int | None, sampling: SamplingParams, vocab: int, device: torch.device | str = "cpu"):
        if sampling.greedy:
            raise InputError("the coupled sampler needs temperature > 0 (temperature 0 is greedy, no noise)")
        self.seed = resolve_seed(seed)       # None: a fresh random seed (a call resolves it first, api._open)
        self.sampling = sampling
        self.vocab = int(vocab)
        self.device = torch.device(device)
        self._rows: dict[int, torch.Tensor] = {}            # position -> [V] noise
        # the keys of positions key_base .. key_base + KEY_WINDOW - 1 on the device ([2, W] halves): a step's
        # noise rows come from a slice of it, so the host sends keys once per KEY_WINDOW positions, not per step
        self._key_halves: torch.Tensor | None = None
        self._key_base = 0

    def _halves(self, first: int, last: int) -> torch.Tensor:
        """[2, last - first + 1] the keys of positions first..last on the device (a slice of the window,
        which moves forward, with one copy from the host, when they fall outside it)."""
        if self._key_halves is None or first < self._key_base or last >= self._key_base + self._key_halves.shape[1]:
            count = max(KEY_WINDOW, last - first + 1)
            keys = [position_key(self.seed, t) for t in range(first, first + count)]
            host = torch.tensor([[k & _M32 for k in keys], [k >> 32 for k in keys]], dtype=torch.long)     # [2, W]
            self._key_halves, self._key_base = to_device(host, self.device), first
        return self._key_halves[:, first - self._key_base: last - self._key_base + 1]

    def __call__(self, positions: Sequence[int]) -> torch.Tensor:
        """[len(positions), V] fp32 noise, row i for positions[i] (repeats allowed)."""
        positions = [int(t) for t in positions]
        if not positions:
            return torch.empty(0, self.vocab, device=self.device)
        missing = sorted({t for t in positions if t not in self._rows})
        if missing:                 # the rows of first..last missing position: one slice of the key window
            first, last = missing[0], missing[-1]
            noise = (-torch.log(-torch.log(uniforms_from_halves(self._halves(first, last), self.vocab)))).float()
            for t in missing:
                self._rows[t] = noise[t - first]
        return torch.stack([self._rows[t] for t in positions])

    def forget_before(self, position: int) -> None:
        """Drop the rows of committed positions (< position): they are never asked for again."""
        for t in [t for t in self._rows if t < position]:
            del self._rows[t]


def make_noise(sampler: str, seed: int | None, sampling: SamplingParams, vocab: int,
               device: torch.device | str) -> GumbelNoise | None:
    """The noise of one call: None under the rejection sampler and at temperature 0 (greedy)."""
    if check_sampler(sampler) == "rejection" or sampling.greedy:
        return None
    return GumbelNoise(seed, sampling, vocab, device)


# ---------------------------------------------------------------------- target and drafters
def coupled_scores(logits: torch.Tensor, positions: Sequence[int], noise: GumbelNoise) -> torch.Tensor:
    """[n, V] logits (target's or a drafter's), row i guessing position positions[i] ->
    [n, V] fp32 warped logits + g_t; filtered-out tokens stay -inf."""
    scores = warp_logits(logits, noise.sampling)                                  # [n, V]
    width = scores.shape[-1]
    if width > noise.vocab:
        raise InputError(f"logits have {width} entries but the coupled noise covers a vocabulary of "
                         f"{noise.vocab}: cut them to the target's vocabulary first")
    return scores + noise(positions)[:, :width].to(scores.device)


def coupled_argmax(logits: torch.Tensor, positions: Sequence[int], noise: GumbelNoise) -> torch.Tensor:
    """[n, V] target logits -> [n] the target's coupled token at each row's position."""
    return coupled_scores(logits, positions, noise).argmax(dim=-1)


def coupled_proposals(draft_logits: torch.Tensor, positions: Sequence[int], noise: GumbelNoise, k: int) -> torch.Tensor:
    """[n, V] draft logits, row i guessing position positions[i] -> [n, k'] proposed tokens: the
    top-k of (draft's warped logits + g_t), best first (k' = k, or fewer when top-k / top-p leave
    fewer tokens in some row: no filtered-out token is proposed). Column 0 is the draft's own
    coupled sample."""
    scores = coupled_scores(draft_logits, positions, noise)                      # [n, V]
    finite = int(torch.isfinite(scores).sum(dim=-1).min())
    return scores.topk(max(1, min(k, finite)), dim=-1).indices


def tree_row_positions(depths: Sequence[int], num_committed: int) -> list[int]:
    """Positions the verifier's rows predict: row 0 (pending token) -> num_committed, row i + 1
    (node i at depth d) -> num_committed + d + 1."""
    return [num_committed] + [num_committed + d + 1 for d in depths]


def coupled_target_tokens(logits: torch.Tensor, tree, num_committed: int, noise: GumbelNoise) -> torch.Tensor:
    """[1 + N, V] verifier logits -> [1 + N] the target's coupled token per row, on the device
    (for accept_greedy, which reads the verdict back once)."""
    noise.forget_before(num_committed)       # drafters ask depth by depth; the verifier reuses their rows
    return coupled_argmax(logits, tree_row_positions(tree.depths(), num_committed), noise)
