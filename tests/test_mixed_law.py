"""Exact output law of mixed trees (prompt-lookup point masses and a draft model's sampled siblings
in one sibling group), through the real loop and acceptance: tests/law.py enumerates every draw.

* `auto` merges a draft tree (siblings sampled without replacement) with lookup paths: neural
  siblings first, lookup point masses after them (strategies/mixed.py).
* The other order, a lookup token first and sampled siblings after it: exact when those siblings
  are drawn without replacement with the lookup token removed, or drawn from the full q with a
  draw of the lookup token dropped (the same law). The negative control draws them correctly but
  claims independent siblings, so acceptance leaves the earlier tokens in q: the law must differ.
"""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from law import generation_law, laws_close, model_dist, sequence_law, token_law, total_variation
from specdec import Speculator
from specdec.costmodel import CostProfile
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.strategies import auto as auto_module
from specdec.strategies.auto import Auto
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.mixed import LOOKUP, NEURAL
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import INDEPENDENT, WITHOUT_REPLACEMENT, CandidateTree

V = 5
PROMPT = [3, 4, 1, 0, 3, 4]            # the suffix [3, 4] occurred before, followed by [1, 0]
TOP3 = SamplingParams(1.0, top_k=3)
TARGET = tiny_model("llama", seed=0, vocab=V, hidden=16, layers=1, sharpen=20.0)
DRAFT = tiny_model("llama", seed=1, vocab=V, hidden=16, layers=1, sharpen=20.0)
FREE = CostProfile((0, 64), (1.0, 1.0), 0, "free")
TENTH = CostProfile((0, 1), (1.0, 1.1), 0, "linear")


def target_law(params, length):
    return sequence_law(model_dist(TARGET, PROMPT, params), length)


def assert_lossless(law, params, length):
    tokens, expected = token_law(law), target_law(params, length)
    assert abs(sum(tokens.values()) - 1) < 1e-6
    assert laws_close(tokens, expected), f"TV to the target's law {total_variation(tokens, expected):.2e}"


class Recording(Auto):
    """Auto that remembers the sources of every verified sibling group (to check the premise)."""
    mixed_groups = 0

    def propose(self, state):
        tree = super().propose(state)
        merged, source, keep = self.pending.merged, self.pending.source, self.pending.keep
        for parent in [-1] + keep:
            kinds = {source[c] for c in merged.children(parent) if c in keep}
            if kinds == {NEURAL, LOOKUP} and merged.draft_probs is not None:
                Recording.mixed_groups += 1
        return tree


@pytest.mark.parametrize("costs", ["free", "tenth"])
@pytest.mark.parametrize("branching", [[2], pytest.param([1, 2], marks=pytest.mark.slow)])
def test_auto_mixed_tree_law_is_the_targets(branching, costs, monkeypatch):
    """Draft siblings (without replacement from 3 tokens) and the lookup path [1, 0] merged at the
    root: the lookup token is either one of the sampled siblings (merged) or a third sibling.
    Frozen calibration (a huge prior) and fixed costs keep the plan a function of the draws; the
    greedy priors (optimistic for lookup) make the "tenth" costs plan lookup nodes beside the
    sampled ones too, so both cost tables test mixed sibling groups."""
    monkeypatch.setattr(auto_module, "PRIOR_ACCEPT_SAMPLED", auto_module.PRIOR_ACCEPT)
    Recording.mixed_groups = 0
    strategy = Recording(PromptLookup(min_ngram=1, max_ngram=2, num_tokens=2, max_matches=2),
                         DraftModel(DRAFT, branching=branching), costs=FREE if costs == "free" else TENTH,
                         adapt_costs=False, draft_cost_s=0.0, explore_every=1, calibration_prior=1e12)
    law = generation_law(Speculator(TARGET, None, strategy), PROMPT, 3, TOP3)
    assert Recording.mixed_groups > 0, "precondition: some sibling group mixed sampled and lookup nodes"
    assert_lossless(law, TOP3, 3)


class LookupFirst:
    """A hand-built mixed root group: the lookup token first (a point mass), then up to two siblings
    sampled without replacement from the draft's distribution q; draft_probs = [one-hot, q, q].
    mode "removed": drawn from q with the lookup token removed; "dropped": drawn from q itself and a
    draw of the lookup token dropped (the same law: the order of the other tokens in a draw
    without replacement is a draw without replacement from them); "claimed_independent": drawn as
    in "removed" but the tree claims independent siblings, so acceptance does not take the earlier
    siblings' tokens (the lookup token's included) out of q: a wrong claim."""
    name = "lookup_first"
    needs_hidden_states = False

    def __init__(self, lookup_token: int, mode: str):
        self.lookup_token, self.mode = lookup_token, mode

    def bind(self, target, tokenizer): pass
    def reset(self, state): pass
    def observe(self, state, result): pass

    @torch.inference_mode()
    def propose(self, state):
        if state.num_generated or state.max_depth <= 0:
            return CandidateTree.empty()
        draft_probs = logits_to_probs(DRAFT(torch.tensor([state.token_ids])).logits[0, -1], state.sampling)  # [V]
        sample_from = draft_probs.clone()
        if self.mode != "dropped":
            sample_from[self.lookup_token] = 0
        drawn = [t for t in state.rng.draw_without_replacement(sample_from / sample_from.sum(), 2).tolist()
                 if t != self.lookup_token]
        tokens = [self.lookup_token] + drawn
        one_hot = torch.nn.functional.one_hot(torch.tensor(self.lookup_token), V).float()
        rows = torch.stack([one_hot] + [draft_probs] * len(drawn))          # [N, V]
        siblings = INDEPENDENT if self.mode == "claimed_independent" else WITHOUT_REPLACEMENT
        return CandidateTree(torch.tensor(tokens), (-1,) * len(tokens), rows, siblings)


def draft_favourite() -> int:
    return int(logits_to_probs(DRAFT(torch.tensor([PROMPT])).logits[0, -1], ALL).argmax())


ALL = SamplingParams(1.0)              # every token of the 5 possible: siblings have 4 to choose from


@pytest.mark.parametrize("mode", ["removed", "dropped"])
def test_lookup_first_then_siblings_without_the_lookup_token_is_exact(mode):
    law = generation_law(Speculator(TARGET, None, LookupFirst(draft_favourite(), mode)), PROMPT, 2, ALL)
    assert_lossless(law, ALL, 2)


def test_negative_control_siblings_claimed_independent():
    law = generation_law(Speculator(TARGET, None, LookupFirst(draft_favourite(), "claimed_independent")),
                         PROMPT, 2, ALL)
    tokens, expected = token_law(law), target_law(ALL, 2)
    assert total_variation(tokens, expected) > 1e-3, "a wrong sibling law must show in the output law"


# ---------------------------------------------------------------------- a learning planner, a sampled-tree drafter
class CountingEagle:
    """Eagle whose propose calls are recorded with the context they drafted after."""

    def __new__(cls, drafter, log, **tree):
        from specdec.strategies.eagle import Eagle

        class Counted(Eagle):
            def propose(self, state):
                log.append(tuple(state.token_ids))
                return super().propose(state)

        return Counted(drafter, **tree)


class PlanLog(Auto):
    """Auto recording, per step: the context, whether the drafter was called, the candidates it
    planned over (the merged tree's tokens and parents) and the nodes it kept."""

    def __init__(self, *args, log, calls, **kwargs):
        super().__init__(*args, **kwargs)
        self.log, self.calls = log, calls

    def propose(self, state):
        before = len(self.calls)
        tree = super().propose(state)
        merged = self.pending.merged
        candidates = (tuple(merged.tokens.tolist()), tuple(merged.parents))
        self.log.append((tuple(state.token_ids), len(self.calls) > before, candidates, tuple(self.pending.keep)))
        return tree


def test_learning_planner_with_a_sampled_tree_drafter_keeps_the_law():
    """auto with eagle's sampled trees (siblings without replacement from the drafter's real
    distributions) beside lookup point masses, and a calibration that learns from every verdict
    (prior 0.1: one observation moves it): what step 2 verifies may depend on what step 1
    accepted. A fresh strategy per enumerated run (what it learned in one run must not
    leak into the next); fixed costs (wall time would make the plan random)."""
    from eagle_helpers import random_drafter
    log, calls = [], []

    def speculator():
        drafter = CountingEagle(random_drafter(TARGET, seed=2), calls, max_nodes=2, top_k=2, depth=2,
                                sampled_top_k=None, sampled_depth=None)
        strategy = PlanLog(PromptLookup(min_ngram=1, max_ngram=2, num_tokens=2, max_matches=2), drafter,
                           costs=CostProfile((0, 1), (1.0, 1.2), 0, "linear"), adapt_costs=False,
                           draft_cost_s=0.0, explore_every=1, calibration_prior=0.1, log=log, calls=calls)
        return Speculator(TARGET, None, strategy)

    law = generation_law(speculator, PROMPT, 3, TOP3)
    assert_lossless(law, TOP3, 3)
    assert any(called for _, called, _, _ in log), "precondition: the drafter's sampled trees were verified"
    assert any(len(keep) < len(candidates[0]) for _, _, candidates, keep in log), "precondition: the planner pruned"


def test_auto_with_token_recycling_law_is_the_targets():
    """auto merging lookup's path [1, 0] with token_recycling's table tree (point masses on both sides,
    merged where they share a token), each replayed call from a fresh strategy: the target's law."""
    from specdec.strategies.token_recycling import TokenRecycling

    def speculator():
        recycling = TokenRecycling(k=2, max_nodes=3, costs=FREE)
        return Speculator(TARGET, None, Auto(PromptLookup(min_ngram=1, max_ngram=2, num_tokens=2, max_matches=1),
                                             recycling, costs=FREE, adapt_costs=False, draft_cost_s=0.0,
                                             explore_every=1))
    law = generation_law(speculator, PROMPT, 3, TOP3)
    assert_lossless(law, TOP3, 3)
    assert sum(p for (_, accepted), p in law.items() if accepted[0] > 0) > 0.01


def test_auto_with_two_drafters_law_is_the_targets():
    """auto holding eagle (sampled trees, siblings without replacement) and token_recycling (point masses), every
    step calling one of them (the least called first: eagle, then the table), each beside lookup's path, each
    replayed call from a fresh strategy: which drafter a step calls depends on the steps before it only, so the
    law is the target's."""
    from eagle_helpers import random_drafter
    from specdec.strategies.token_recycling import TokenRecycling
    log, calls, table_calls = [], [], []

    class CountedTable(TokenRecycling):
        def propose(self, state):
            table_calls.append(tuple(state.token_ids))
            return super().propose(state)

    def speculator():
        eagle = CountingEagle(random_drafter(TARGET, seed=2), calls, max_nodes=2, top_k=2, depth=2,
                              sampled_top_k=None, sampled_depth=None)
        strategy = PlanLog(PromptLookup(min_ngram=1, max_ngram=2, num_tokens=2, max_matches=1), eagle,
                           more_drafters=[CountedTable(k=2, max_nodes=3, costs=FREE)], costs=FREE,
                           adapt_costs=False, draft_cost_s=0.0, explore_every=1, log=log, calls=calls)
        return Speculator(TARGET, None, strategy)

    law = generation_law(speculator, PROMPT, 3, TOP3)
    assert_lossless(law, TOP3, 3)
    assert calls and table_calls, "precondition: both drafters' trees were verified"


def _auto_with_rest(folder):
    """A fresh auto per replayed call: lookup's path beside rest's trie from `folder`."""
    from specdec.strategies.rest import Rest

    def speculator():
        rest = Rest(folder, min_match=1, max_match=4, depth=2, max_nodes=3)
        return Speculator(TARGET, None, Auto(PromptLookup(min_ngram=1, max_ngram=2, num_tokens=2, max_matches=1),
                                             rest, costs=FREE, adapt_costs=False, draft_cost_s=0.0, explore_every=1))
    return speculator


@pytest.fixture(scope="module")
def rest_datastore(tmp_path_factory):
    """A datastore where the prompt's suffix [3, 4] goes on as [4, 4] and [4, 3], and 4 as [0, ...]:
    rest's trie differs from lookup's path [1, 0], so the merged tree has siblings of both."""
    from specdec.strategies.datastore import build
    folder = tmp_path_factory.mktemp("rest")
    build([[3, 4, 4, 4, 0], [3, 4, 4, 3], [4, 0, 0, 1]], str(folder), "law test")
    return str(folder)


def test_auto_with_rest_law_is_the_targets(rest_datastore):
    """auto merging lookup's path with rest's datastore trie (point masses on both sides): the target's law."""
    law = generation_law(_auto_with_rest(rest_datastore), PROMPT, 3, TOP3)
    assert_lossless(law, TOP3, 3)
    # a first token 4 kept from the first tree is rest's (lookup's path starts with 1)
    assert sum(p for (tokens, accepted), p in law.items() if accepted[0] > 0 and tokens[0] == 4) > 0.01


def test_negative_control_auto_with_rest_always_accepting_is_not_the_targets_law(rest_datastore):
    from unittest import mock
    from law import always_accept
    with mock.patch("specdec.loop.accept_sampling", always_accept):
        tokens = token_law(generation_law(_auto_with_rest(rest_datastore), PROMPT, 3, TOP3))
    assert total_variation(tokens, target_law(TOP3, 3)) > 0.05
