"""What the tests of the drafters that draft with the target's own layers (early_exit, layer_skip) share: that
their view keeps its hooks to itself, the exact output law through the rejection sampler, its negative
controls (a verifier that accepts everything, a drafter that lies about its distribution), and the coupled
sampler's same-seed-same-text with its negative control. Each test file passes its own strategy and settings."""
from __future__ import annotations

from collections import Counter
from unittest import mock

import torch

from conftest import tiny_model
from law import always_accept, generation_law, laws_close, model_dist, sequence_law, token_law, total_variation
from specdec import Speculator
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.strategies.autoregressive import Autoregressive

def check_hooks_stay_apart(view, target, prompt: list[int]) -> None:
    """A hook on the view never fires when the target runs."""
    calls = []
    handle = view.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        target(torch.tensor([prompt]))
    handle.remove()
    assert calls == []


V = 5
LAW_TARGET = tiny_model("llama", seed=0, vocab=V, hidden=16, layers=2, sharpen=20.0)
LAW_PROMPT = [3, 4, 1, 0]
TOP2 = SamplingParams(1.0, top_k=2)
LAW_CASES = [(dict(num_tokens=2), TOP2), (dict(num_tokens=2), SamplingParams(0.8, top_p=0.6)),
             (dict(branching=[2]), TOP2), (dict(branching=[1, 2]), TOP2)]      # (shape, sampling)


def target_law(params, length: int = 3) -> dict:
    return sequence_law(model_dist(LAW_TARGET, LAW_PROMPT, params), length)


def check_output_law(strategy, params) -> None:
    """The strategy's output law on LAW_TARGET is the target's; some drafts were kept and some rejected."""
    law = generation_law(Speculator(LAW_TARGET, None, strategy), LAW_PROMPT, 3, params)
    tokens, expected = token_law(law), target_law(params)
    assert laws_close(tokens, expected), f"TV {total_variation(tokens, expected):.2e}"
    assert sum(p for (_, accepted), p in law.items() if accepted[0] > 0) > 0.05      # drafts were kept
    assert sum(p for (_, accepted), p in law.items() if accepted[0] == 0) > 0.01     # and rejected


def check_always_accept_breaks_the_law(strategy) -> None:
    sd = Speculator(LAW_TARGET, None, strategy)
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(sd, LAW_PROMPT, 3, TOP2))
    assert total_variation(tokens, target_law(TOP2)) > 0.05


def lying(cls):
    """A subclass of the DraftModel `cls` that samples from its draft distribution but reports a flatter one."""

    def _pick(self, logits, widths, state, position):
        tokens, counts, _true_probs = cls._pick(self, logits, widths, state, position)
        return tokens, counts, logits_to_probs(logits / 4, state.sampling)

    return type(f"Lying{cls.__name__}", (cls,), {"_pick": _pick})


def check_a_lying_drafter_breaks_the_law(strategy) -> None:
    tokens = token_law(generation_law(Speculator(LAW_TARGET, None, strategy), LAW_PROMPT, 3, TOP2))
    assert total_variation(tokens, target_law(TOP2)) > 0.02


def coupled(target, strategy, prompt: list[int], n: int, seed: int) -> list[int]:
    return Speculator(target, None, strategy).generate(prompt, max_new_tokens=n, temperature=0.8, seed=seed,
                                                       ignore_eos=True, sampler="coupled").token_ids


def check_coupled_reproduces_autoregressive(target, make, prompt: list[int], n: int) -> None:
    """Under the coupled sampler, strategies from make() give autoregressive's text for seeds 0 and 1, and
    keep some drafts."""
    accepted = Counter()
    for seed in (0, 1):
        out = Speculator(target, None, make()).generate(prompt, max_new_tokens=n, temperature=0.8, seed=seed,
                                                        ignore_eos=True, sampler="coupled")
        assert out.token_ids == coupled(target, Autoregressive(), prompt, n, seed)
        accepted.update(out.stats.accepted_lengths)
    assert sum(count for length, count in accepted.items() if length > 0) > 0


def check_the_rejection_sampler_gives_other_texts(target, make, prompt: list[int], n: int) -> None:
    texts = {tuple(Speculator(target, None, make()).generate(prompt, max_new_tokens=n, temperature=0.8, seed=seed,
                                                             ignore_eos=True).token_ids) for seed in (0, 1, 2)}
    assert texts != {tuple(coupled(target, Autoregressive(), prompt, n, seed)) for seed in (0, 1, 2)}
