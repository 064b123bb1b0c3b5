"""auto with early_exit as its drafter, priced from shadow tokens (BaseStrategy.expected_call).

* greedy identity to Hugging Face generate(do_sample=False): one sequence (a fixed exit layer, KV reuse on
  and off, and early_exit.auto) and a ragged batch, before and after the counts are in;
* where the shadow acceptance at the exit layer loses to lookup alone, the drafter is never called: auto
  waits for the counts, which come from the steps it verifies without calling it, then prices it out;
* where the target's first layers draft its own tokens, it is called once the counts say so;
* the expected call itself: the counts' acceptance at the layer it drafts at, and nothing it cannot say
  (sampling, trees, a batch's steps, which give no hidden states); inside auto every committed row is
  counted once, as a fresh forward over the committed text counts it;
* sampled requests (rejection and coupled) ask for no hidden states and keep the rules before.
"""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, tiny_model
from test_auto import PROMPT, dear_nodes
from test_early_exit import upper_layers_silenced
from specdec import Speculator
from specdec.sampling import SamplingParams
from specdec.strategies.auto import Auto
from specdec.strategies.early_exit import CHOOSE_ROWS, EarlyExit
from specdec.strategies.prompt_lookup import PromptLookup

N = 48
PROMPTS = (PROMPT, PROMPT[::-1] + PROMPT, PROMPT[2:])


@lru_cache(maxsize=None)
def random_target():
    """4 random layers: an exit keeps about half of the target's tokens, far below what an exit at 3 costs."""
    return tiny_model("llama", seed=0, layers=4, sharpen=3.0)


@lru_cache(maxsize=None)
def first_layer_target():
    """Layers 2 to 4 add nothing: an exit at 1 drafts the target's own tokens, at a quarter of a forward."""
    return upper_layers_silenced(random_target(), 1)


def auto_with(drafter: EarlyExit) -> Auto:
    return Auto(PromptLookup(min_ngram=1, max_ngram=3), drafter, costs=dear_nodes(0.05), adapt_costs=False,
                draft_cost_s=0.0)


def counted_proposals(drafter: EarlyExit) -> list[float]:
    """Wrap the drafter's propose: the list fills with the rows counted at each call."""
    rows = []
    propose = drafter.propose
    drafter.propose = lambda state: (rows.append(drafter.counts.rows), propose(state))[1]
    return rows


def generate_all(sd: Speculator, target) -> int:
    """Greedy generations of N tokens from each prompt, each checked against Hugging Face; their steps."""
    steps = 0
    for prompt in PROMPTS:
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
        steps += out.stats.target_forwards
    return steps


# ---------------------------------------------------------------------- identity
@pytest.mark.parametrize("target_of", [random_target, first_layer_target])
@pytest.mark.parametrize("settings", [dict(exit_layer=1), dict(exit_layer=3), dict(exit_layer=1, reuse_kv=False),
                                      dict(exit_layer=2, auto=True, every=2)])
def test_greedy_identity_one_sequence(target_of, settings):
    target = target_of()
    drafter = EarlyExit(num_tokens=3, **settings)
    generate_all(Speculator(target, None, auto_with(drafter)), target)
    assert drafter.counts.rows >= CHOOSE_ROWS             # every step auto verified was counted while young


@pytest.mark.parametrize("target_of", [random_target, first_layer_target])
def test_greedy_identity_ragged_batch_before_and_after_the_counts(target_of):
    target, tokenizer = target_of(), char_tokenizer()
    prompts = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "ab"]
    lengths = [20, 7, 30, 12]
    drafter = EarlyExit(1, num_tokens=3)
    sd = Speculator(target, tokenizer, auto_with(drafter))
    for _ in range(2):                                     # young counts; then in, from the one sequence between
        outs = sd.generate(prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
        for prompt, out, n in zip(prompts, outs, lengths):
            assert out.token_ids == hf_greedy(target, tokenizer(prompt)["input_ids"], n, eos_token_id=None)
        sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert drafter.counts.rows >= CHOOSE_ROWS


@pytest.mark.parametrize("target_of,explore_every", [(random_target, 8), (first_layer_target, 1)])
def test_the_counts_are_those_of_a_fresh_forward_over_the_committed_text(target_of, explore_every):
    """auto hands a step to its drafter in parts (its own tree's rows, then one row per token after them):
    every committed row is counted once, against the token committed after it, called (on every step, with
    explore_every 1) or never (a drafter that loses)."""
    target = target_of()
    drafter = EarlyExit(2, num_tokens=3)
    strategy = auto_with(drafter)
    strategy.explore_every = explore_every
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    text = PROMPT + out.token_ids
    rows = int(drafter.counts.rows)                       # every step but the last (it stops; no observe)
    assert N // 4 < rows < N + 1
    with torch.no_grad():
        after_layer_2 = target(torch.tensor([text]), output_hidden_states=True).hidden_states[2][0]   # [T, H]
    first = len(PROMPT) - 1                               # the first committed row: the prompt's pending token
    shadow = target.lm_head(target.model.norm(after_layer_2[first: first + rows])).argmax(-1)
    assert drafter.counts.matches.tolist() == [int((shadow == torch.tensor(text[first + 1: first + 1 + rows])).sum())]
    assert strategy.neural_calls == (0 if explore_every > 1 else out.stats.target_forwards)


# ---------------------------------------------------------------------- when it is called
def test_a_drafter_whose_shadow_acceptance_loses_is_never_called():
    """An exit at 3 of 4 layers costs three quarters of a forward a drafted token; its tokens are kept about
    as often as not. auto waits for the counts rather than call it, then never calls it."""
    target = random_target()
    drafter = EarlyExit(3, num_tokens=3)
    strategy = auto_with(drafter)
    calls = counted_proposals(drafter)
    generate_all(Speculator(target, None, strategy), target)
    assert drafter.counts.rows >= CHOOSE_ROWS and drafter.counts.acceptance()[0] < 0.9
    assert calls == [] and strategy.neural_calls == 0


def test_without_the_counts_the_same_drafter_is_called():
    """The negative control: the same drafter, its pricing taken away (a strategy written without it),
    is called on its first steps and looks, as before."""
    target = random_target()
    drafter = EarlyExit(3, num_tokens=3)
    drafter.expected_call = lambda state: None
    strategy = auto_with(drafter)
    calls = counted_proposals(drafter)
    generate_all(Speculator(target, None, strategy), target)
    assert len(calls) > 0


def test_a_drafter_whose_first_layer_is_the_model_is_called():
    target = first_layer_target()
    drafter = EarlyExit(1, num_tokens=3)
    calls = counted_proposals(drafter)
    generate_all(Speculator(target, None, auto_with(drafter)), target)
    assert drafter.counts.acceptance()[0] > 0.95
    assert sum(rows >= CHOOSE_ROWS for rows in calls) > 0          # called once the counts are in


def test_with_its_exit_chosen_it_is_priced_at_the_best_exit():
    """early_exit.auto on the target whose first layer is the model: priced (and drafting) at exit 1."""
    target = first_layer_target()
    drafter = EarlyExit(3, num_tokens=3, auto=True, every=2)
    calls = counted_proposals(drafter)
    sd = Speculator(target, None, auto_with(drafter))
    generate_all(sd, target)
    state = type("State", (), {"sampling": SamplingParams(), "max_depth": 8})()
    expected = drafter.expected_call(state)
    assert expected.accept == (drafter.counts.acceptance()[0],) * len(expected.accept)
    assert expected.cost == pytest.approx(len(expected.accept) / 4)
    assert sum(rows >= CHOOSE_ROWS for rows in calls) > 0 and drafter.exit_layer == 1


def test_batch_rows_whose_steps_give_no_hidden_states_do_not_wait_for_counts(monkeypatch):
    """A batch's forwards give no hidden states: with the counts young, its rows call the drafter by the
    rules before (their first steps), rather than wait for counts that never arrive."""
    target, tokenizer = first_layer_target(), char_tokenizer()
    drafted = []
    propose_many = EarlyExit.propose_many
    monkeypatch.setattr(EarlyExit, "propose_many", staticmethod(
        lambda drafters, states, batch: (drafted.append(len(drafters)), propose_many(drafters, states, batch))[1]))
    drafter = EarlyExit(1, num_tokens=3)
    sd = Speculator(target, tokenizer, auto_with(drafter))
    sd.generate(["class Foo:", "def parse(text):", "ab"], max_new_tokens=16, ignore_eos=True, batch_size=3)
    assert drafter.counts.rows == 0 and sum(drafted) > 0


# ---------------------------------------------------------------------- what the drafter can say
def test_the_expected_call_says_nothing_it_cannot_know():
    target = random_target()
    greedy = type("State", (), {"sampling": SamplingParams(), "max_depth": 8})()
    sampled = type("State", (), {"sampling": SamplingParams(temperature=0.8), "max_depth": 8})()
    alone = EarlyExit(2, num_tokens=3)
    Speculator(target, None, alone)
    assert alone.expected_call(greedy) is None             # not inside auto: nothing counted
    drafter = EarlyExit(2, num_tokens=3)
    Speculator(target, None, auto_with(drafter))
    drafter.counts_arrive = True
    assert drafter.expected_call(greedy).accept is None   # counts young, arriving: wait
    drafter.counts_arrive = False
    assert drafter.expected_call(greedy) is None           # a batch's steps: they never arrive
    assert drafter.feature_layers == (2,)                 # a fixed exit layer counts its own shadow tokens alone
    drafter.counts.add(torch.tensor([10.0]), 40)
    expected = drafter.expected_call(greedy)
    assert expected.accept == pytest.approx((11 / 42,) * 3) and expected.cost == pytest.approx(3 * 2 / 4)
    assert drafter.expected_call(sampled) is None          # a shadow token is an argmax, not a sample
    tree = EarlyExit(2, branching=[2, 2])
    Speculator(target, None, auto_with(tree))
    tree.counts.add(torch.tensor([10.0]), 40)
    assert tree.expected_call(greedy) is None              # siblings keep what a shadow token misses


def test_hidden_states_are_asked_on_counting_steps_only():
    """Young counts: every step auto verifies asks; past young, one step in `every`, called or not."""
    from specdec.strategies.shadow import YOUNG_ROWS
    target = random_target()
    drafter = EarlyExit(3, num_tokens=3, every=4)
    strategy = auto_with(drafter)
    sd = Speculator(target, None, strategy)
    drafter.counts.add(torch.zeros(1), YOUNG_ROWS)         # past young, its exit layer losing
    asked = []
    observe = strategy.observe
    strategy.observe = lambda state, result: (asked.append(result.hidden is not None), observe(state, result))
    sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert len(asked) > 4 and asked == [step % 4 == 0 for step in range(len(asked))]
    assert strategy.neural_calls == 0


@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
def test_sampled_requests_are_decided_by_the_rules_before(sampler):
    """At T > 0 a shadow token (an argmax) prices nothing: no hidden states are asked, nothing is counted,
    and auto calls the drafter by its other rules (its first calls, then looks); the coupled sampler's text
    is autoregressive's for the same seed."""
    target = random_target()
    drafter = EarlyExit(3, num_tokens=3)
    strategy = auto_with(drafter)
    calls = counted_proposals(drafter)
    asked = []
    observe = strategy.observe
    strategy.observe = lambda state, result: (asked.append(result.hidden is not None), observe(state, result))
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, temperature=0.8, seed=3,
                                                      sampler=sampler, ignore_eos=True)
    assert asked and not any(asked) and drafter.counts.rows == 0 and len(calls) > 0
    if sampler == "coupled":
        from specdec.strategies.autoregressive import Autoregressive
        plain = Speculator(target, None, Autoregressive()).generate(PROMPT, max_new_tokens=N, temperature=0.8, seed=3,
                                                                    sampler="coupled", ignore_eos=True)
        assert out.token_ids == plain.token_ids
