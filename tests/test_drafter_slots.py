"""auto holding several drafters (auto.more_drafters): which one a step calls (strategies/drafter_slots.pick),
and auto with two drafters end to end: greedy identity, each drafter calibrated apart, clear refusals."""
import pytest

from conftest import hf_greedy
from test_greedy_identity import target_of
from specdec import Speculator
from specdec.strategies.drafter_slots import (LOOK, PAYS, STALL_FACTOR, STEADY, SWITCH_MARGIN, DrafterSlot, call_cost,
                                             first_leader, pick)

CONTEXT = ("greedy", 0)
PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33]     # ends with a repeated 3-gram: lookup finds it


def slots(*reasons, calls=None):
    made = []
    for i, reason in enumerate(reasons):
        slot = DrafterSlot(object(), f"neural:{i}")
        slot.reason = reason
        slot.neural_calls = 0 if calls is None else calls[i]
        made.append(slot)
    return made


def test_a_steady_call_then_a_look_go_before_a_drafter_that_pays():
    pays, looks, steady = slots(PAYS, LOOK, STEADY)
    assert pick([pays, looks, steady], CONTEXT, lambda s: 1.0, 8, 64, {}) is steady
    assert pick([pays, looks], CONTEXT, lambda s: 1.0, 8, 64, {}) is looks
    assert pick([pays], CONTEXT, lambda s: None, 8, 64, {}) is pays
    assert pick([], CONTEXT, lambda s: 1.0, 8, 64, {}) is None


def test_an_unranked_drafter_is_called_first_the_least_called_of_them():
    first, second, third = slots(PAYS, PAYS, PAYS, calls=[3, 1, 0])
    rates = {first.key: 5.0, second.key: None, third.key: None}
    assert pick([first, second, third], CONTEXT, lambda s: rates[s.key], 8, 64, {}) is third


def test_the_first_drafter_leads_until_another_beats_it_by_the_margin():
    first, second = slots(PAYS, PAYS)
    leaders = {}
    rates = {first.key: 1.0, second.key: SWITCH_MARGIN * 0.99}
    rate = lambda s: rates[s.key]                                       # noqa: E731
    picked = [pick([first, second], CONTEXT, rate, 8, 64, leaders) for _ in range(7)]
    assert picked == [first] * 7 and leaders[CONTEXT] == first.key
    rates[second.key] = SWITCH_MARGIN * 1.01                            # now clearly better: it takes the lead
    assert pick([first, second], CONTEXT, rate, 8, 64, leaders) is second and leaders[CONTEXT] == second.key
    rates[first.key] = rates[second.key] * 1.05                         # back within the margin: the lead stays
    assert pick([first, second], CONTEXT, rate, 8, 64, leaders) is second


def test_a_drafter_behind_is_looked_at_on_a_doubling_gap_per_context():
    first, second = slots(PAYS, PAYS)
    rate = lambda s: 2.0 if s is first else 1.0                        # noqa: E731
    leaders = {}
    calls = [pick([first, second], CONTEXT, rate, 4, 16, leaders) for _ in range(60)]
    looks = [step for step, slot in enumerate(calls) if slot is second]
    assert looks == [3, 11, 27, 43, 59]                                 # gaps 4, 8, 16, then capped at 16
    other = ("greedy", 2)                                               # another context keeps its own schedule
    assert [pick([first, second], other, rate, 4, 16, leaders) for _ in range(4)][-1] is second


def test_a_leader_that_does_not_pay_this_step_keeps_the_lead():
    """A step where the leader is not wanted (it loses to lookup alone there, for now) calls the best of the others
    without handing them the lead: before, one such step made the other the leader, which the first then had to
    beat by the margin to lead again."""
    first, second = slots(PAYS, PAYS)
    leaders = {CONTEXT: first.key}
    rate = lambda s: 1.0                                                # noqa: E731
    assert pick([second], CONTEXT, rate, 8, 64, leaders) is second and leaders[CONTEXT] == first.key
    third = slots(PAYS, PAYS, PAYS)[2]
    assert pick([second, third], CONTEXT, rate, 8, 64, leaders) in (second, third)
    assert leaders[CONTEXT] == first.key
    assert pick([first, second], CONTEXT, rate, 8, 64, leaders) is first


def test_a_call_costs_the_mean_of_its_calls_catch_ups_in_stalls_out():
    assert call_cost([1.0, 1.0, 1.0, 2.5]) == pytest.approx(5.5 / 4)       # a catch-up is part of the cost
    assert call_cost([1.0, 1.0, 1.0, 1.0, 100.0]) == pytest.approx(1.0)    # a stall is not
    assert call_cost([1.0, 1.0, STALL_FACTOR]) == pytest.approx((2.0 + STALL_FACTOR) / 3)
    assert call_cost([100.0] * 5 + [1.0] * 4) == pytest.approx((500.0 + 4.0) / 9)   # most calls dear: dear


def test_the_table_leads_greedy_steps_first_and_the_first_drafter_sampled_ones():
    class Dear:
        leads_greedy = False

    class Table:
        leads_greedy = True
    dear, table = DrafterSlot(Dear(), "neural"), DrafterSlot(Table(), "neural:token_recycling")
    assert first_leader([dear, table], greedy=True) is table
    assert first_leader([dear, table], greedy=False) is dear
    both_dear = [DrafterSlot(Dear(), "neural"), DrafterSlot(Dear(), "neural:x")]
    assert first_leader(both_dear, greedy=True) is both_dear[0]


# (a slow table when sampling is left out: auto prices its calls out within a dozen, and its mode is then lookup
# alone, about as fast as the lookahead's there, so which leads is a coin toss)
@pytest.mark.parametrize("slow, temperature", [("lookahead", 0.0), ("lookahead", 0.8), ("token_recycling", 0.0)])
def test_one_sequence_keeps_the_leader_measured_faster(monkeypatch, slow, temperature):
    """auto weighs its first leader (the table) against the others by the wall time of their steps: greedy on a
    CPU on paired samples (strategies/paired_leader.py: the table's guesses scored on the others' steps), sampled
    by its leader gate (each mode's own steps). Whichever drafter is made slow (30 ms a draft) ends without the
    lead, or without calls beyond a few looks: auto may price a slow drafter out on its own, and then its mode
    is lookup's alone, which may rightly lead. Greedy identity holds throughout."""
    import time
    from specdec.strategies.lookahead import Lookahead
    from specdec.strategies.token_recycling import TokenRecycling
    target = target_of("llama")
    strategy = auto_with(target, "lookahead")
    cls = {"token_recycling": TokenRecycling, "lookahead": Lookahead}[slow]
    propose = cls.propose

    slow_calls = []

    def slowed(self, state):
        slow_calls.append(1)
        time.sleep(0.03)
        return propose(self, state)

    monkeypatch.setattr(cls, "propose", slowed)
    sd = Speculator(target, None, strategy)
    out = sd.generate(PROMPT, max_new_tokens=160, ignore_eos=True, temperature=temperature, seed=0)
    if temperature == 0:
        assert out.token_ids == hf_greedy(target, PROMPT, 160, eos_token_id=None)
    table, other = strategy.slots
    assert other.drafter.name == "lookahead" and first_leader(strategy.slots, greedy=temperature == 0) is table
    if temperature == 0:
        judge = strategy.paired_leaders["greedy"]
        assert judge.table_seconds() is not None and judge.pairs and "greedy" not in strategy.leader_gates
        table_leads, why = judge.table_leads, (judge.paired_rates(list(judge.pairs)), judge.table_seconds())
    else:
        gate = strategy.leader_gates["mid"]
        assert gate.measured() and not strategy.paired_leaders
        table_leads, why = gate.best, (gate.rate(True), gate.rate(False))
    slow_leads = table_leads if slow == "token_recycling" else not table_leads
    assert not slow_leads or len(slow_calls) <= 10, (why, len(slow_calls))


# ---------------------------------------------------------------------- auto with two drafters, end to end
def auto_with(target, *more, **settings):
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    cfg = load_spec_config("auto", {"auto.drafter": "token_recycling", "auto.more_drafters": list(more),
                                    "auto.profile": False, **settings})
    return build_strategy(cfg, target, None, target.device, target.dtype)


def test_auto_with_two_drafters_is_greedy_identical_and_calls_both():
    """token_recycling first, layer_skip beside it (a dear second drafter), every step called: each drafter is
    called, its nodes calibrated under its own name, and the text is Hugging Face's greedy one."""
    from specdec.strategies.layer_skip import LayerSkip
    from specdec.strategies.token_recycling import TokenRecycling
    target = target_of("llama")
    strategy = auto_with(target, "layer_skip", "token_recycling", **{"layer_skip.attention": [0],
                                                                      "auto.explore_every": 1})
    assert [type(part) for part in strategy.drafters()] == [TokenRecycling, LayerSkip]   # the first held once
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=48, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 48, eos_token_id=None)
    assert all(slot.neural_calls > 0 for slot in strategy.slots), [slot.neural_calls for slot in strategy.slots]
    names = {key[0].rstrip("+").rstrip("^") for key in strategy.calibrator.tried}
    assert {"neural", "neural:layer_skip"} <= names


def test_more_drafters_are_refused_by_name_and_where_they_read_other_hidden_states():
    from specdec.config import load_spec_config
    from specdec.errors import ConfigError
    from specdec.strategies.auto import Auto
    with pytest.raises(ConfigError, match="beam.*every entry must be one of"):
        load_spec_config("auto", {"auto.more_drafters": ["beam"]})

    class Reads:
        def __init__(self, name, layers):
            self.name, self.needs_hidden_states, self.feature_layers, self.top_k_ids = name, True, layers, 0

        def bind(self, target, tokenizer): pass
        def reset(self, state): pass
        def propose(self, state): pass
        def observe(self, state, result): pass

    with pytest.raises(ConfigError, match="different hidden states"):
        Auto(None, Reads("one", None), more_drafters=[Reads("two", (1, 2))], profile=False)


def test_the_table_is_held_beside_a_trained_drafter_unless_more_drafters_is_given():
    """auto.more_drafters null: the target's own table beside eagle / medusa / draft_model (a drafter that costs
    real time per call), nothing beside the table itself, a drafter of the target's own layers, or none;
    an explicit list, empty included, is taken as given."""
    from specdec.config import load_spec_config
    from specdec.strategies.auto import more_drafter_names, pick_drafter

    def held(**overrides):
        cfg = load_spec_config("auto", overrides)
        first = pick_drafter(cfg)
        return first, more_drafter_names(cfg, first)

    assert held(**{"eagle.path": "E"}) == ("eagle", ["token_recycling"])
    assert held(**{"heads.path": "H"}) == ("medusa", ["token_recycling"])
    assert held(**{"draft.path": "D"}) == ("draft_model", ["token_recycling"])
    assert held() == ("token_recycling", [])
    assert held(**{"auto.drafter": "early_exit"}) == ("early_exit", [])
    assert held(**{"auto.drafter": "none", "eagle.path": "E"}) == (None, [])
    assert held(**{"eagle.path": "E", "auto.more_drafters": []}) == ("eagle", [])
    assert held(**{"draft.path": "D", "auto.more_drafters": ["layer_skip"]}) == ("draft_model", ["layer_skip"])


def test_a_batch_calls_the_first_drafter_alone_and_one_sequence_calls_both(monkeypatch):
    """In a batch a step calls only auto's first drafter (the one a batch drafts for all its rows together); the
    same auto on one sequence calls the one beside it too (explore_every 1: each in turn, no leader gate).
    Greedy identity holds either way."""
    target = target_of("llama")
    strategy = auto_with(target, "layer_skip", **{"layer_skip.attention": [0], "auto.explore_every": 1,
                                                  "auto.batch_gate": False})
    from specdec.strategies.auto import Auto
    called = []                     # (rows in the step's batch, the drafter's key): every row's copy records here
    pick_slot = Auto._pick_slot

    def recording(self, state, context):
        slot = pick_slot(self, state, context)
        called.append((state.batch_size, None if slot is None else slot.key))
        return slot

    monkeypatch.setattr(Auto, "_pick_slot", recording)
    sd = Speculator(target, None, strategy)
    prompts = [PROMPT, PROMPT[::-1] + PROMPT, PROMPT[2:] * 2]
    outs = sd.generate(prompts, max_new_tokens=32, ignore_eos=True)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(target, prompt, 32, eos_token_id=None)
    in_batch = {key for rows, key in called if rows > 1} - {None}      # None: no drafter (no depth left)
    assert in_batch == {"neural"}, called
    called.clear()
    out = sd.generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, 48, eos_token_id=None)
    assert {key for _, key in called} - {None} == {"neural", "neural:layer_skip"}, called
