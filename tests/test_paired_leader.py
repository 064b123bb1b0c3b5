"""auto's greedy leader judged on paired samples (strategies/paired_leader.py): the table's guesses scored on the
text the other drafter's steps committed, the judge's decisions on them, and TokenRecycling.peek."""
import pytest

from conftest import hf_greedy
from test_drafter_slots import PROMPT, auto_with
from test_greedy_identity import target_of
from specdec import Speculator
from specdec.strategies import auto as auto_module
from specdec.strategies.batch_gate import BatchGate
from specdec.strategies.paired_leader import PairedLeader, score_guesses
from specdec.strategies.token_recycling import TokenRecycling

CHAIN = ([7, 8, 9], (-1, 0, 1), [0, 1, 2])       # a 3-token chain guess: (tokens, parents, kept nodes)


def test_a_guess_waits_for_its_text_then_keeps_its_longest_matching_part():
    lookup = ([7, 8, 5], (-1, 0, 1), [0, 1, 2])
    waiting = [(2, 3, 0.01, (CHAIN, lookup), False)]
    still, pairs = score_guesses(waiting, [1, 2, 7, 8])             # the guesses are 3 levels deep: 3 tokens needed
    assert still == waiting and pairs == []
    still, pairs = score_guesses(waiting, [1, 2, 7, 8, 5])
    assert still == [] and pairs == [(3, 0.01, 1 + 3, False)]       # lookup's chain matched all 3: 3 + the target's
    _, pairs = score_guesses([(2, 3, 0.01, (CHAIN,), True)], [1, 2, 7, 4, 5])
    assert pairs == [(3, 0.01, 1 + 1, True)]                        # 7 matched, then 4 is not 8
    unkept = ([7, 8, 9], (-1, 0, 1), [0])                           # a node not kept is not guessed, nor waited for
    still, pairs = score_guesses([(2, 3, 0.01, (unkept,), False)], [1, 2, 7])
    assert still == [] and pairs[0][2] == 1 + 1


def drive(judge: PairedLeader, steps: int, other: tuple[int, float], table_kept: int,
          table: tuple[int, float] = (4, 0.01), own_kept: int | None = None, delay: int = 0) -> list[bool]:
    """Run the judge `steps` steps: a step the table runs is recorded as `table` (tokens, seconds) and its guess
    said own_kept (default: what it kept); a step the other runs is a pair of `other` (tokens, seconds) with the
    table's guess keeping table_kept there. Guesses are scored `delay` steps after their step (their text is
    committed later). Whether the table ran, per step."""
    ran, scored = [], []
    for step in range(steps):
        table_runs = judge.lead()
        ran.append(table_runs)
        if table_runs:
            judge.record_table(*table)
            scored.append((step + delay, (table[0], table[1], table[0] if own_kept is None else own_kept, True)))
        else:
            scored.append((step + delay, (other[0], other[1], table_kept, False)))
        judge.add_pairs([pair for due, pair in scored if due == step])
    return ran


def test_the_table_leads_first_then_the_other_leads_where_it_makes_more_on_the_same_steps():
    judge = PairedLeader(gap=8, probe_steps=6)
    ran = drive(judge, 8, other=(6, 0.01), table_kept=4)
    assert ran[:7] == [True] * 7 and judge.table_leads              # the table leads, until the gap's look
    drive(judge, 20, other=(6, 0.01), table_kept=4)                 # 600 tokens/s against the table's 400 there
    assert not judge.table_leads


def test_a_look_that_loses_keeps_the_table_and_doubles_the_gap():
    judge = PairedLeader(gap=8, probe_steps=6)
    ran = drive(judge, 120, other=(3, 0.01), table_kept=4)           # 300 against 400
    assert judge.table_leads and judge.gap >= 32
    looks = [i for i in range(1, len(ran)) if not ran[i] and ran[i - 1]]
    spacing = [later - earlier for earlier, later in zip(looks, looks[1:])]
    assert len(spacing) >= 2 and spacing[1] >= spacing[0] + 8       # each look waits twice as long as the last


def test_a_look_is_judged_when_its_steps_are_scored_later():
    """Guesses are scored some steps after their own (the text they guessed comes later): the table leads meanwhile,
    and the look is judged on its steps once they are in. Control: scored too late (past the judging wait), the
    look gets no verdict, and the gap stays as it was."""
    judge = PairedLeader(gap=8, probe_steps=6)
    drive(judge, 40, other=(9, 0.01), table_kept=4, delay=10)
    assert not judge.table_leads
    late = PairedLeader(gap=8, probe_steps=6)
    drive(late, 40, other=(9, 0.01), table_kept=4, delay=40)
    assert late.table_leads and late.gap == 8


def test_the_table_takes_the_lead_back_where_its_guesses_make_more():
    judge = PairedLeader(gap=8, probe_steps=6)
    drive(judge, 30, other=(6, 0.01), table_kept=4)
    assert not judge.table_leads
    drive(judge, 30, other=(6, 0.01), table_kept=8)                  # the table warmed: 800 against 600
    assert judge.table_leads


def test_guesses_that_overrate_the_table_are_scaled_by_what_its_own_steps_kept():
    """The table's guess takes its whole tree and lookup's plan; where its own steps keep half what their guesses
    said, its paired rate is halved: 4 guessed on the other's steps is 200 tokens/s, not 400."""
    fair, biased = PairedLeader(gap=8, probe_steps=6), PairedLeader(gap=8, probe_steps=6)
    drive(fair, 40, other=(3, 0.01), table_kept=4)
    drive(biased, 40, other=(3, 0.01), table_kept=4, own_kept=8)
    assert fair.table_leads and fair.guess_bias() == 1.0
    assert not biased.table_leads and biased.guess_bias() == pytest.approx(0.5)


def test_the_verdict_is_on_the_same_stretch_not_on_each_leaders_own():
    """The table's own steps ran on hard text (2 tokens a step: 200 tokens/s); the look at the other lands on easy
    text, where it makes 800 tokens/s and the table's guesses would have made 1000. Judged on the same steps the
    table keeps the lead; a gate comparing each leader's own steps (the control) hands it to the other."""
    judge = PairedLeader(gap=8, probe_steps=6)
    drive(judge, 40, other=(8, 0.01), table_kept=10, table=(2, 0.01), own_kept=2)
    assert judge.table_leads
    gate = BatchGate(probe_steps=8, gap=8, memory=48, margin=0.0, fresh_probes=True, explore=0.1)
    for _ in range(40):
        table_runs = gate.mode(0)
        gate.record(table_runs, 2 if table_runs else 8, 0.01, 1)
    assert gate.best is False


def test_peek_is_what_propose_drafts_and_changes_nothing(monkeypatch):
    """auto holding the table and a lookahead, greedy on a CPU: the paired judge peeks at the table on the other's
    steps and on some of the table's own. Where the table then drafts in the same step, it drafts exactly what the
    peek said; a peek leaves the table's
    step count and tree sizes as they were. Greedy identity holds."""
    target = target_of("llama")
    strategy = auto_with(target, "lookahead")
    propose, peek = TokenRecycling.propose, TokenRecycling.peek
    peeks, checked = {}, []

    def recorded_peek(self, state):
        before = (self.steps, list(self.tree_sizes))
        peeked = peek(self, state)
        assert (self.steps, self.tree_sizes) == before
        peeks[len(state.token_ids)] = peeked
        return peeked

    def checked_propose(self, state):
        tree = propose(self, state)
        if len(state.token_ids) in peeks:       # the judge peeks on the table's own steps now and then
            assert peeks.pop(len(state.token_ids)) == (tree.tokens.tolist(), tuple(tree.parents))
            checked.append(tree.num_nodes)
        return tree

    monkeypatch.setattr(auto_module, "PAIRED_BIAS_EVERY", 1)     # a peek on every step of the table's too
    monkeypatch.setattr(TokenRecycling, "peek", recorded_peek)
    monkeypatch.setattr(TokenRecycling, "propose", checked_propose)
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        peeks.clear()                           # keyed by length: one call's at a time
        out = sd.generate(prompt, max_new_tokens=60, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 60, eos_token_id=None)
    assert len(checked) > 3 and max(checked) > 0 and strategy.paired_leaders["greedy"].table_steps
