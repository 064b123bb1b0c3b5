"""Divergences between the target's and the draft's next-token distributions, for distilling a
draft model into its target (`specdec train-draft`).

Speculative sampling accepts a drafted token with probability 1 - TV(target, draft) (Leviathan et
al.), so the draft should be trained to agree with the distribution the target will *sample from*:
the target's logits after the user's temperature, top-k and top-p (`warp_logits`, the one warp the
library decodes with); temperature 0 is the greedy case, where the target's distribution is the
point mass on its argmax. The draft's distribution is its softmax at the same temperature (1 in the
greedy case), never filtered: a filter would give the tokens it drops no gradient, and at inference
the draft's own filter keeps the tokens where training put its mass.

Every loss takes log-probabilities [N, V] (the target's with -inf on filtered tokens) and returns
the mean over the N rows:

  fkl   KL(target || draft)  = sum_x p (log p - log q)          mode-covering
  rkl   KL(draft || target)  = sum_x q (log q - log p)          mode-seeking; log p is floored at
        LOG_FLOOR where the target's filter removed x (else infinite wherever the draft still
        puts mass)
  jsd   generalised Jensen-Shannon with beta: beta KL(p || m) + (1 - beta) KL(q || m), m = beta p +
        (1 - beta) q (GKD's definition; beta = 0.5 is the symmetric JSD)
  tvd   TV(p, q) = 1/2 sum_x |p - q|, whose minimum is the acceptance rate itself
  ce    cross-entropy of the draft on the data's own next tokens (mixed in, as in GKD, to keep the
        draft on the text; needs labels)
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from specdec.errors import ConfigError
from specdec.sampling import SamplingParams, warp_logits

DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")
LOSSES = DIVERGENCES + ("ce",)
LOG_FLOOR = math.log(1e-6)      # rkl's log p where the target's filter gives p = 0


def _rows(values: torch.Tensor) -> torch.Tensor:
    return values.mean()


def forward_kl(target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p || q), mean over rows; terms with p = 0 are 0."""
    target_probs = target_logprobs.exp()                                          # [N, V]
    terms = torch.where(target_probs > 0, target_probs * (target_logprobs - draft_logprobs),
                        torch.zeros_like(target_probs))
    return _rows(terms.sum(-1))


def reverse_kl(target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(q || p), mean over rows; log p floored at LOG_FLOOR where the target's filter removed x."""
    draft_probs = draft_logprobs.exp()                                            # [N, V]
    floored = target_logprobs.clamp_min(LOG_FLOOR)
    return _rows((draft_probs * (draft_logprobs - floored)).sum(-1))


def jensen_shannon(target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q; finite for any supports."""
    if not 0 < beta < 1:
        raise ConfigError(f"jsd_beta must be in (0, 1), got {beta}")
    mixture_logprobs = torch.logsumexp(torch.stack([target_logprobs + math.log(beta),
                                                    draft_logprobs + math.log(1 - beta)]), dim=0)   # [N, V]
    return beta * forward_kl(target_logprobs, mixture_logprobs) + (1 - beta) * forward_kl(draft_logprobs,
                                                                                         mixture_logprobs)


def total_variation(target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor) -> torch.Tensor:
    """1/2 sum |p - q|, mean over rows: 1 - the expected acceptance of a drafted token."""
    return _rows(0.5 * (target_logprobs.exp() - draft_logprobs.exp()).abs().sum(-1))


def divergence(name: str, target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor,
               beta: float = 0.5) -> torch.Tensor:
    if name == "fkl":
        return forward_kl(target_logprobs, draft_logprobs)
    if name == "rkl":
        return reverse_kl(target_logprobs, draft_logprobs)
    if name == "jsd":
        return jensen_shannon(target_logprobs, draft_logprobs, beta)
    if name == "tvd":
        return total_variation(target_logprobs, draft_logprobs)
    raise ConfigError(f"unknown divergence {name!r}: use one of {', '.join(DIVERGENCES)}")


def loss_weights(loss) -> dict[str, float]:
    """`loss` as written in a config: a name ("rkl") or a mix ({rkl: 0.9, ce: 0.1}) -> {name: weight}."""
    if isinstance(loss, str):
        weights = {loss: 1.0}
    elif isinstance(loss, Mapping):
        weights = {str(k): float(v) for k, v in loss.items()}
    else:
        raise ConfigError(f"loss must be a name ({', '.join(LOSSES)}) or a mix like {{rkl: 0.9, ce: 0.1}}, "
                          f"got {loss!r}")
    unknown = sorted(set(weights) - set(LOSSES))
    if unknown:
        raise ConfigError(f"unknown loss {unknown[0]!r}: use {', '.join(LOSSES)} or a mix like {{rkl: 0.9, ce: 0.1}}")
    if any(not (w >= 0 and math.isfinite(w)) for w in weights.values()) or not any(weights.values()):
        raise ConfigError(f"loss weights must be finite, >= 0 and not all 0, got {weights}")
    if set(weights) == {"ce"}:
        raise ConfigError("loss ce alone trains on the text, not on the target: mix it with a divergence, "
                          "e.g. loss={rkl: 0.9, ce: 0.1}")
    return weights


def target_log_probs(target_logits: torch.Tensor, temperature: float, top_k: int = 0,
                     top_p: float = 1.0) -> torch.Tensor:
    """[..., V] -> log-probabilities of the distribution the target samples from (-inf where
    filtered); temperature 0: the point mass on the argmax."""
    if temperature == 0:
        best = target_logits.argmax(dim=-1, keepdim=True)
        return torch.full_like(target_logits, float("-inf"), dtype=torch.float32).scatter(-1, best, 0.0)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.log_softmax(warp_logits(target_logits, params), dim=-1)


def draft_log_probs(draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] -> the draft's log-probabilities at the loss temperature (1 in the greedy case)."""
    logits = draft_logits.float()
    if temperature not in (0, 1):
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def distill_loss(weights: dict[str, float], target_logits: torch.Tensor, draft_logits: torch.Tensor,
                 labels: torch.Tensor | None, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 beta: float = 0.5) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted sum of the named losses over N positions: target_logits / draft_logits [N, V]
    (the target's without grad), labels [N] (the data's next tokens; needed for ce). Returns
    (loss, each term's value)."""
    target_logprobs = target_log_probs(target_logits.detach(), temperature, top_k, top_p)   # [N, V]
    draft_logprobs = draft_log_probs(draft_logits, temperature)                               # [N, V]
    total, parts = draft_logits.new_zeros((), dtype=torch.float32), {}
    for name, weight in weights.items():
        if name == "ce":
            if labels is None:
                raise ValueError("the ce loss needs the data's next tokens")
            term = torch.nn.functional.cross_entropy(draft_logits.float(), labels)
        else:
            term = divergence(name, target_logprobs, draft_logprobs, beta)
        parts[name] = float(term.detach())
        total = total + weight * term
    return total, parts
