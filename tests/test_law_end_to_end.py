"""The exact output law of a whole generate() call, through the real strategies and the real loop.

On a 5-token vocabulary with tiny random models, tests/law.py enumerates every random draw of a
Speculator.generate call (the draft model's chain tokens and tree siblings, acceptance's Bernoulli
trials and categorical draws: all go through the call's one random source) and compares the exact
law of the new tokens with the target's own law, enumerated from the target model's conditional
distributions under the same temperature / top-k / top-p. Negative controls (an always-accept
verifier, a draft that lies about the distribution it sampled from) must fail that comparison.
"""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from conftest import tiny_model
from law import always_accept, generation_law, laws_close, model_dist, sequence_law, token_law, total_variation
from specdec import Speculator
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.heads.io import output_vocab
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup

V = 5
NEW = 3                      # new tokens per call: the first step's chain of 2 + its bonus token
PROMPT = [3, 4, 1, 0]
TOP2 = SamplingParams(1.0, top_k=2)
WARPS = {
    "top-k": TOP2,
    "temperature-top-p": SamplingParams(0.8, top_p=0.6),
}


def tiny(seed: int, sharpen: float = 20.0):
    """A 1-layer llama over V tokens; sharpen=20 gives peaked but not degenerate distributions."""
    return tiny_model("llama", seed=seed, vocab=V, hidden=16, layers=1, sharpen=sharpen)


TARGET = tiny(0)
DRAFT = tiny(1)


def target_law(prompt, params, target=TARGET, length=NEW) -> dict:
    return sequence_law(model_dist(target, prompt, params), length)


def assert_lossless(law: dict, prompt, params, target=TARGET):
    tokens = token_law(law)
    expected = target_law(prompt, params, target)
    assert abs(sum(tokens.values()) - 1) < 1e-6
    assert laws_close(tokens, expected), (
        f"output law differs from the target's: TV {total_variation(tokens, expected):.2e}")


def probability(law: dict, event) -> float:
    return sum(p for (tokens, accepted), p in law.items() if event(tokens, accepted))


# ---------------------------------------------------------------------- draft_model
@pytest.mark.parametrize("warp", WARPS)
def test_draft_model_chain_law_is_the_targets(warp):
    params = WARPS[warp]
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=2))
    law = generation_law(sd, PROMPT, NEW, params)
    assert_lossless(law, PROMPT, params)
    # both drafted tokens kept, then the bonus token from the target below the chain's leaf
    assert probability(law, lambda tokens, accepted: accepted == (2,)) > 0.05
    assert probability(law, lambda tokens, accepted: accepted[0] < 2) > 0.05   # rejections too


@pytest.mark.parametrize("branching", [[2], [1, 2], pytest.param([2, 1], marks=pytest.mark.slow)])
def test_draft_model_tree_law_is_the_targets(branching):
    """Siblings drawn without replacement (a second child excludes the first): at the root with
    [2] and [2, 1], below a first drafted token with [1, 2]."""
    sd = Speculator(TARGET, None, DraftModel(DRAFT, branching=branching))
    law = generation_law(sd, PROMPT, NEW, TOP2)
    assert_lossless(law, PROMPT, TOP2)
    assert probability(law, lambda tokens, accepted: accepted[0] == len(branching)) > 0.05


@pytest.mark.parametrize("branching", [[2], [3]])
def test_draft_model_siblings_from_three_tokens(branching):
    """top_k=3: a second (third) sibling is drawn from the draft renormalized without the first
    ones, a distribution the verifier must reconstruct. 2 new tokens: one tree, then its bonus or
    correction."""
    params = SamplingParams(1.0, top_k=3)
    sd = Speculator(TARGET, None, DraftModel(DRAFT, branching=branching))
    law = generation_law(sd, PROMPT, 2, params)
    tokens = token_law(law)
    expected = sequence_law(model_dist(TARGET, PROMPT, params), 2)
    assert laws_close(tokens, expected), f"TV {total_variation(tokens, expected):.2e}"


def test_zero_residual_branch():
    """Draft == target and top_k=1: target and draft distributions are the same one-hot, so a
    rejection has probability 0 and leaves an all-zero residual max(0, r - q). Enumerating the
    zero-probability outcomes too runs that branch: it must still draw a valid token."""
    from specdec import acceptance
    zero_residuals = []
    real = acceptance._normalized

    def spy(residual):
        out = real(residual)
        zero_residuals.append(out is None)
        return out

    params = SamplingParams(1.0, top_k=1)
    sd = Speculator(TARGET, None, DraftModel(TARGET, num_tokens=2))
    with mock.patch.object(acceptance, "_normalized", spy):
        law = generation_law(sd, PROMPT, NEW, params, explore_zero=True)
    assert any(zero_residuals), "precondition: the all-zero residual branch was reached"
    assert_lossless(law, PROMPT, params)


# ---------------------------------------------------------------------- medusa, prompt lookup
def noisy_heads(model, num_heads: int = 2, noise: float = 0.5, seed: int = 0,
                token_conditioned: bool = False) -> MedusaHeads:
    heads = MedusaHeads(HeadsLayout(num_heads, 1, model.config.hidden_size, output_vocab(model),
                                    token_conditioned=token_conditioned))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(noise * torch.randn(p.shape, generator=gen))
    return heads


@pytest.mark.parametrize("token_conditioned", [False, True])
def test_medusa_law_is_the_targets(token_conditioned):
    """The sampled tree: siblings drawn without replacement from the heads' real distributions
    (plain heads: one per depth; token-conditioned: per parent token), every draw enumerated."""
    heads = noisy_heads(TARGET, token_conditioned=token_conditioned)
    sd = Speculator(TARGET, None, Medusa(heads, max_nodes=4, top_k=2))
    law = generation_law(sd, PROMPT, NEW, TOP2)
    assert_lossless(law, PROMPT, TOP2)
    assert probability(law, lambda tokens, accepted: accepted[0] > 0) > 0.01   # guesses were kept


def test_prompt_lookup_law_is_the_targets():
    """The prompt ends with the bigram (1, 3) seen before, so lookup proposes what followed it,
    (0, 1): tokens the target finds likely there."""
    prompt = [1, 3, 0, 1, 1, 3]
    sd = Speculator(TARGET, None, PromptLookup(min_ngram=2, max_ngram=2, num_tokens=2))
    law = generation_law(sd, prompt, NEW, TOP2)
    assert_lossless(law, prompt, TOP2)
    assert probability(law, lambda tokens, accepted: accepted[0] > 0) > 0.01   # lookups were kept


class FrozenSuffix:
    """A Suffix whose cross-call cache does not learn from the enumerated calls (they replay one
    call many times): the law is that of drafting from a fixed global tree. Each replayed call gets
    a fresh one (generation_law's factory): its drafting gate also learns across calls."""

    @staticmethod
    def make(outputs, **settings):
        from specdec.strategies.suffix import Suffix
        suffix = Suffix(**settings)
        for tokens in outputs:
            suffix.cache.add("default", tokens)
        suffix.finish = lambda state: None
        return suffix


@pytest.mark.parametrize("tree", [True, False])
def test_suffix_law_is_the_targets_when_the_cache_disagrees(tree):
    """The global tree holds outputs continuing the prompt's end with tokens the target finds
    unlikely (and, less often, one it finds likely): point-mass drafts, several branches in tree
    mode, rejected or accepted, and the law is still the target's."""
    likely = int(model_dist(TARGET, PROMPT, TOP2)(()).argmax())
    unlikely = [t for t in range(V) if t != likely]
    outputs = [PROMPT[-2:] + [unlikely[0], unlikely[1]]] * 3 + [PROMPT[-2:] + [unlikely[2], likely]] * 2 + \
        [PROMPT[-2:] + [likely, unlikely[0]]]
    law = generation_law(lambda: Speculator(TARGET, None, FrozenSuffix.make(
        outputs, max_spec_factor=2.0, max_nodes=4, min_token_prob=0.0, tree=tree)), PROMPT, NEW, TOP2)
    assert_lossless(law, PROMPT, TOP2)
    assert probability(law, lambda tokens, accepted: accepted[0] > 0) > 0.01   # a draft was kept sometimes
    assert probability(law, lambda tokens, accepted: accepted[0] == 0) > 0.01  # and rejected sometimes


def recycler():
    """A fresh token_recycling per replayed call (its table and calibration learn across calls), with
    cheap nodes so that it drafts a tree of both ranks."""
    from specdec.costmodel import CostProfile
    from specdec.strategies.token_recycling import TokenRecycling
    return Speculator(TARGET, None, TokenRecycling(k=2, max_nodes=3, costs=CostProfile((0, 8), (1.0, 1.01), 0)))


RECYCLE_PROMPT = [3, 4, 1, 0, 4]      # the pending token 4 read before: its row is seeded by the prefill


def test_token_recycling_law_is_the_targets():
    """Point-mass trees read from the table (seeded by the prefill, rewritten after the first step by
    every node of its forward), kept or rejected, and the law is still the target's."""
    law = generation_law(recycler, RECYCLE_PROMPT, NEW, TOP2)
    assert_lossless(law, RECYCLE_PROMPT, TOP2)
    # the first step's roots are the target's top-2 there, of which top-k = 2 sampling keeps one; the
    # second step's tree, read from the rows the first step rewrote, is kept at times and not at others
    assert probability(law, lambda tokens, accepted: accepted[0] > 0) > 0.99
    assert probability(law, lambda tokens, accepted: accepted[1:] == (0,)) > 0.01
    assert probability(law, lambda tokens, accepted: len(accepted) == 1) > 0.01   # two kept in one step


def test_negative_control_always_accept_through_token_recycling():
    """The same enumeration through token_recycling catches a verifier that keeps every first child."""
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(recycler, RECYCLE_PROMPT, NEW, TOP2))
    assert total_variation(tokens, target_law(RECYCLE_PROMPT, TOP2)) > 0.05


# ---------------------------------------------------------------------- negative controls
def test_negative_control_always_accept_verifier():
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=2))
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        law = generation_law(sd, PROMPT, NEW, TOP2)
    tokens = token_law(law)
    assert not laws_close(tokens, target_law(PROMPT, TOP2))
    assert total_variation(tokens, target_law(PROMPT, TOP2)) > 0.05


class LyingDraft(DraftModel):
    """Samples from its distribution but reports a flatter one to the verifier."""

    def _pick(self, logits, widths, state, position):
        tokens, counts, _true_probs = super()._pick(logits, widths, state, position)
        return tokens, counts, logits_to_probs(logits / 4, state.sampling)


def test_negative_control_draft_that_lies_about_its_distribution():
    sd = Speculator(TARGET, None, LyingDraft(DRAFT, num_tokens=2))
    tokens = token_law(generation_law(sd, PROMPT, NEW, TOP2))
    assert not laws_close(tokens, target_law(PROMPT, TOP2))
    assert total_variation(tokens, target_law(PROMPT, TOP2)) > 0.02


# ---------------------------------------------------------------------- the production branches
def test_negative_control_one_uniform_for_every_trial():
    """The enumeration follows the step's pre-drawn uniforms (tests/law.py): acceptance that reused
    one uniform for every trial of a step (correlated coins) must show in the law."""
    import law
    real = law._Replay.uniforms
    sd = Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=2))      # the depth-2 coin follows the depth-1 one
    with mock.patch.object(law._Replay, "uniforms", lambda self, n: real(self, 1).repeat(n)):
        tokens = token_law(generation_law(sd, PROMPT, NEW, TOP2))
    assert total_variation(tokens, target_law(PROMPT, TOP2)) > 1e-3


def test_negative_control_race_that_keeps_the_slowest():
    """The drafters' sibling draws run production's exponential race on the enumerated outcomes: a
    race that ranked the wrong way round is caught."""
    from specdec import sampling
    from law import LawError
    real = sampling.race_winners
    sd = Speculator(TARGET, None, DraftModel(DRAFT, branching=[2]))
    with mock.patch.object(sampling, "race_winners", lambda probs, noise, count: real(-probs, noise, count)):
        with pytest.raises(LawError, match="race_winners"):
            generation_law(sd, PROMPT, NEW, TOP2)


# ---------------------------------------------------------------------- rest
def rest_speculator(tmp_path):
    """rest over a corpus where the prompt's end [1, 0] is followed by likely and unlikely tokens."""
    from specdec.strategies.datastore import build
    from specdec.strategies.rest import Rest
    likely = int(model_dist(TARGET, PROMPT, TOP2)(()).argmax())
    unlikely = [t for t in range(V) if t != likely]
    build([[1, 0, unlikely[0], unlikely[1]]] * 2 + [[1, 0, likely, unlikely[2]], [1, 0, unlikely[2], likely]],
          tmp_path / "ds", "law test")
    return Speculator(TARGET, None, Rest(str(tmp_path / "ds"), max_nodes=3, depth=2))


def test_rest_law_is_the_targets(tmp_path):
    law = generation_law(rest_speculator(tmp_path), PROMPT, NEW, TOP2)
    assert_lossless(law, PROMPT, TOP2)
    assert probability(law, lambda tokens, accepted: accepted[0] > 0) > 0.01          # drafts kept
    assert probability(law, lambda tokens, accepted: 0 in accepted) > 0.01            # and a step keeping none


def test_negative_control_always_accept_through_rest(tmp_path):
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(rest_speculator(tmp_path), PROMPT, NEW, TOP2))
    assert total_variation(tokens, target_law(PROMPT, TOP2)) > 0.05


# ---------------------------------------------------------------------- lookahead
def lookahead_speculator():
    """Lookahead with a window of 3 columns and 2-grams: its first step verifies the first level (two
    tokens drawn from the prompt), the next one the target's own guesses and the pooled 2-grams."""
    from specdec.strategies.lookahead import Lookahead
    return Speculator(TARGET, None, Lookahead(window=3, ngram=2, guesses=2, pool_from_context=True))


def test_lookahead_law_is_the_targets():
    law = generation_law(lookahead_speculator, PROMPT, NEW, TOP2)
    assert_lossless(law, PROMPT, TOP2)
    assert probability(law, lambda tokens, accepted: sum(accepted) > 0) > 0.01      # lookahead nodes kept
    assert probability(law, lambda tokens, accepted: accepted[0] == 0) > 0.01       # and a step keeping none


def test_negative_control_always_accept_through_lookahead():
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(lookahead_speculator, PROMPT, NEW, TOP2))
    assert total_variation(tokens, target_law(PROMPT, TOP2)) > 0.05
