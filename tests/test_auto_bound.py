"""auto with a drafter that prices its call by a bound (layer_skip: every token kept, at its draft cost,
BaseStrategy.expected_call): where even that loses to lookup alone, the drafter is never called, not even
on a first step or a look; where it does not, the measured calls decide as before. Greedy identity holds
either way."""
from __future__ import annotations

import pytest

from conftest import hf_greedy, tiny_model
from test_auto import PROMPT, dear_nodes
from specdec import Speculator
from specdec.strategies.auto import Auto
from specdec.strategies.layer_skip import LayerSkip
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.types import DecodeState

N = 32


def target():
    return tiny_model("llama", seed=0, layers=4, sharpen=3.0)


def run(per_node: float, bound: bool = True) -> tuple[Auto, LayerSkip, list[int]]:
    """auto + layer_skip (layer 0's attention skipped: most of a forward a drafted token) at verify costs of
    per_node plain steps a tree node; the drafter's proposals counted. bound=False: its bound taken away."""
    model = target()
    drafter = LayerSkip(attention=[0], num_tokens=3)
    if not bound:
        drafter.expected_call = lambda state: None
    strategy = Auto(PromptLookup(min_ngram=1, max_ngram=3), drafter, costs=dear_nodes(per_node), adapt_costs=False,
                    draft_cost_s=0.0)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda state: (proposals.append(len(state.token_ids)), propose(state))[1]
    sd = Speculator(model, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, prompt, N, eos_token_id=None)
    return strategy, drafter, proposals


def test_a_drafter_that_loses_even_with_every_token_kept_is_never_called():
    strategy, drafter, proposals = run(per_node=0.5)
    assert drafter.draft_cost > 0.8, "precondition: a drafted token costs most of a forward"
    assert proposals == [] and strategy.neural_calls == 0


def test_without_its_bound_the_same_drafter_is_called():
    """The negative control: the same drafter and costs, its bound taken away: called on first steps and looks."""
    _, _, proposals = run(per_node=0.5, bound=False)
    assert len(proposals) > 0


def test_where_its_bound_pays_the_calls_decide_as_before():
    """The control: verify rows nearly free, so a call whose tokens were all kept would pay: it is called."""
    strategy, _, proposals = run(per_node=0.0)
    assert len(proposals) > 0 and strategy.neural_calls > 0


@pytest.mark.parametrize("max_depth", [1, 8])
def test_the_bound_keeps_every_token_at_the_draft_cost(max_depth):
    model = target()
    drafter = LayerSkip(attention=[0], num_tokens=3)
    Speculator(model, None, drafter).generate(PROMPT, max_new_tokens=4, ignore_eos=True)   # bound and reset
    state = DecodeState.__new__(DecodeState)
    state.max_depth = max_depth
    length = min(3, max_depth)
    assert drafter.expected_call(state) == ((1.0,) * length, drafter.draft_cost * length)
