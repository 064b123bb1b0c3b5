"""auto's batch gate (strategies/batch_gate.py): in a batch, speculate or decode plainly, whichever
measured more of the batch's tokens per second; the mode changes between batch steps only; and the
batch verifier's row drop (the batch shrinking as prompts run out) keeps every row's cache."""
from __future__ import annotations

import torch

from conftest import char_tokenizer, hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.batch import BatchVerifier
from specdec.sampling import SamplingParams
from specdec.strategies.auto import Auto
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.batch_gate import BatchGate
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import CandidateTree
from specdec.types import DecodeState
from specdec.verifier import Verifier

PROMPTS = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)\n", "ab"]
LENGTHS = [20, 7, 30, 12]


def run_steps(gate: BatchGate, steps: int, rows: int, rates: dict[bool, float], draining: bool = False) -> list[bool]:
    """Drive the gate like a batch of `rows` rows: each step every row asks its mode, then records a
    sample of the rate its mode runs at (tokens per second of the batch). The modes of each step.
    draining: the steps are in a call's drain (no prompt waiting)."""
    modes = []
    for _ in range(steps):
        step = {gate.mode(row, draining=draining) for row in range(rows)}
        assert len(step) == 1                         # all rows of a step speculate, or none
        mode = step.pop()
        modes.append(mode)
        for _ in range(rows):
            gate.record(mode, 4, 4 * rows / rates[mode], rows)    # 4 tokens at the batch rate rates[mode]
    return modes


def test_gate_keeps_plain_decoding_when_it_measures_faster():
    gate = BatchGate(probe_steps=3, gap=8, max_gap=32)
    modes = run_steps(gate, 200, 4, {True: 50.0, False: 100.0})
    assert modes[0] is True                           # speculation is tried first
    assert gate.best is False and gate.rate(False) > gate.rate(True)
    # after the switch, speculation is looked at again for probe_steps steps, ever more rarely (the gap doubles)
    tail = modes[100:]
    assert tail.count(True) <= 3 * (len(tail) // 32 + 1)
    assert tail.count(True) > 0                       # but still looked at: the batch may change


def test_gate_keeps_speculating_when_it_measures_faster():
    gate = BatchGate(probe_steps=3, gap=8, max_gap=64)
    modes = run_steps(gate, 200, 16, {True: 300.0, False: 200.0})
    assert gate.best is True
    assert modes[100:].count(False) <= 3 * (100 // 64 + 1)


def test_speculation_must_win_by_the_margin():
    """Speculation's costs outside the measured steps (rows draining apart, new rows' catch-up) are
    not in its rate: within MARGIN of plain decoding, plain decoding is kept; past it, speculation."""
    close = BatchGate(probe_steps=3, gap=8, max_gap=64, margin=0.05)
    run_steps(close, 200, 16, {True: 206.0, False: 200.0})
    assert close.best is False and close.rate(True) > close.rate(False)
    clear = BatchGate(probe_steps=3, gap=8, max_gap=64, margin=0.05)
    run_steps(clear, 200, 16, {True: 214.0, False: 200.0})
    assert clear.best is True
    even = BatchGate(probe_steps=3, gap=8, max_gap=64, margin=0.0)      # no margin: the faster mode
    run_steps(even, 200, 16, {True: 206.0, False: 200.0})
    assert even.best is True


def test_gate_does_not_look_at_speculation_in_a_drain():
    """In a call's drain (no prompt waiting) a look at speculation would leave the rows ragged, so the
    call waits for its slowest row: while plain decoding is best, the gate looks at speculation only
    while prompts wait. A gate that has only seen drains still measures both modes once; looking at
    plain decoding (it makes no row ragged) goes on in a drain."""
    rates = {True: 50.0, False: 100.0}
    drained = BatchGate(probe_steps=3, gap=4, max_gap=8)
    first = run_steps(drained, 40, 4, rates, draining=True)
    assert first[0] is True and False in first           # the first look, in a drain too
    assert drained.best is False
    assert True not in run_steps(drained, 300, 4, rates, draining=True)
    assert True in run_steps(drained, 300, 4, rates, draining=False)   # prompts wait: it looks again
    speculating = BatchGate(probe_steps=3, gap=4, max_gap=8)
    run_steps(speculating, 40, 4, {True: 200.0, False: 100.0})
    assert speculating.best is True
    tail = run_steps(speculating, 300, 4, {True: 200.0, False: 100.0}, draining=True)
    assert False in tail and speculating.best is True


def test_gate_that_starts_in_plain_decoding_looks_at_speculation_only_where_prompts_wait():
    """A gate started in plain decoding (a smaller batch measured speculation losing) owes speculation
    no first look: in a drain it stays plain; while prompts wait it looks after its gap, and keeps
    speculating where it pays."""
    start_plain = BatchGate(probe_steps=3, gap=4, max_gap=8, speculate_first=False)
    assert True not in run_steps(start_plain, 200, 4, {True: 200.0, False: 100.0}, draining=True)
    assert True in run_steps(start_plain, 100, 4, {True: 200.0, False: 100.0})
    assert start_plain.best is True


def gate_measured(best: bool) -> BatchGate:
    """A gate that measured both modes and keeps `best`."""
    gate = BatchGate(gap=10 ** 6)
    gate.best = gate.speculate = best
    gate.record(True, 3 if best else 1, 1.0, 4)
    gate.record(False, 1 if best else 3, 1.0, 4)
    gate.end_step()
    return gate


def test_a_new_batch_size_starts_as_the_largest_smaller_one_measured():
    """auto's gate of a batch size it meets first speculates first only where the largest smaller batch
    size (same temperature kind, both modes measured) measured speculation beating plain decoding by
    the margin: speculation pays less as the batch grows."""
    strategy = Auto(None, None, profile=False)

    def first_mode(batch_size: int, temperature: float) -> bool:
        state = DecodeState(token_ids=[1, 2, 3], prompt_len=3, sampling=SamplingParams(temperature=temperature),
                            rng=None, max_depth=4, batch_size=batch_size)
        strategy.reset(state)                                  # a row's first step
        return strategy._gate_modes(state)[0]

    assert first_mode(32, 0.8) is True                     # nothing measured: speculate first
    strategy.batch_gates = {(4, "mid"): gate_measured(True), (16, "mid"): gate_measured(False),
                            (8, "greedy"): gate_measured(False), (64, "mid"): gate_measured(True)}
    assert first_mode(32, 0.8) is False                    # 16 lost (not 4, not the larger 64)
    assert first_mode(8, 0.8) is True                      # 4 paid
    assert first_mode(32, 0.0) is False                    # greedy's own: 8 lost
    assert first_mode(4, 0.0) is True                      # nothing smaller measured
    unmeasured = BatchGate()
    unmeasured.best = False
    strategy.batch_gates = {(16, "mid"): unmeasured}
    assert first_mode(32, 0.8) is True                     # a gate that measured one mode says nothing
    tie = BatchGate(gap=10 ** 6)                           # speculating, at plain decoding's rate
    tie.record(True, 2, 1.0, 4)
    tie.record(False, 2, 1.0, 4)
    tie.end_step()
    strategy.batch_gates = {(16, "mid"): tie}
    assert tie.best is True and first_mode(32, 0.8) is False


def states_seen(field: str) -> list:
    """DecodeState.<field> as every row saw it before each proposal, in a batch call of 8 prompts of
    3-9 new tokens, 2 rows at a time."""
    seen = []

    class Spy(Autoregressive):
        def propose(self, state):
            seen.append(getattr(state, field))
            return super().propose(state)

    sd = Speculator(tiny_model("llama", seed=1), char_tokenizer(), Spy())
    sd.generate(PROMPTS * 2, max_new_tokens=[3, 5, 7, 9] * 2, ignore_eos=True, batch_size=2)
    return seen


def test_the_batch_tells_rows_how_many_prompts_wait():
    """decode_batch's batch_waiting: the prompts not started yet, as a row sees it before its proposal;
    0 once the last prompt started (the call's drain)."""
    seen = states_seen("batch_waiting")
    assert seen[0] == len(PROMPTS) * 2 - 2                # two started, six wait
    assert all(b <= a for a, b in zip(seen, seen[1:]))   # it only falls, by the prompts started
    assert seen[-1] == 0 and seen.count(0) >= 9 - 1       # the last rows drain: the longest runs 9 tokens


def test_gate_bounds_what_looking_around_costs():
    """Probes of a losing mode are spaced by what they cost: the time they lose against the best mode is
    at most about `explore` of the time (here a speculating step costs two plain ones for the same tokens,
    so with the step gap at its floor the time rule alone spaces the probes)."""
    plain_s, spec_s = 4 * 4 / 100.0, 4 * 4 / 50.0           # one step's seconds in each mode (4 rows)
    lost_share = {}
    for explore in (0.05, 1.0):
        gate = BatchGate(probe_steps=3, gap=4, max_gap=4, explore=explore)
        tail = run_steps(gate, 800, 4, {True: 50.0, False: 100.0})[100:]
        assert gate.best is False
        lost = tail.count(True) * (spec_s - plain_s)
        lost_share[explore] = lost / (tail.count(True) * spec_s + tail.count(False) * plain_s)
    assert 0 < lost_share[0.05] <= 0.05 * 1.5               # still looks, at a bounded cost
    assert lost_share[1.0] > 3 * lost_share[0.05]            # without the rule the step gap alone decides


def test_gate_does_not_switch_on_a_calls_first_steps():
    """A call's first speculating steps are its slowest (the drafter catches up on whole prompts; a
    warm-up call is nothing else): the gate measures speculation for first_samples steps before it
    looks at plain decoding, so those steps alone do not send it to plain decoding, where the next look
    at speculation would wait 1 / explore times what they lost."""
    gate = BatchGate(probe_steps=4, gap=8, max_gap=64)
    modes = run_steps(gate, 3, 8, {True: 40.0, False: 200.0})          # slow start: 5x below plain
    modes += run_steps(gate, 120, 8, {True: 300.0, False: 200.0})       # then speculation pays
    assert gate.best is True
    runs = "".join("P" if mode is False else "S" for mode in modes).split("S")
    assert max(len(run) for run in runs) <= gate.probe_steps            # plain decoding only in looks


def test_gate_follows_a_change():
    """A machine (or a text) where speculation stops paying: the gate moves to plain decoding."""
    gate = BatchGate(probe_steps=3, gap=8, max_gap=16)
    run_steps(gate, 100, 4, {True: 300.0, False: 200.0})
    assert gate.best is True
    run_steps(gate, 100, 4, {True: 100.0, False: 200.0})
    assert gate.best is False


def test_fresh_probes_judge_a_mode_by_its_look_not_by_its_old_steps():
    """A mode whose own speed changes while the other runs (auto's leaders: the table warms up on every
    verify): with fresh_probes a look forgets that mode's old steps, so the first look after it got faster
    brings it back; without, its old slow steps outweigh the look's few and the gate stays away."""
    def drive(fresh: bool) -> BatchGate:
        gate = BatchGate(probe_steps=8, gap=8, max_gap=64, memory=48, margin=0.0, explore=0.25,
                         fresh_probes=fresh)
        run_steps(gate, 60, 1, {True: 50.0, False: 100.0})      # the first mode starts slow: the other leads
        assert gate.best is False
        run_steps(gate, 40, 1, {True: 200.0, False: 100.0})     # then the first mode is twice as fast
        return gate

    fresh = drive(True)
    assert fresh.best is True and abs(fresh.rate(True) - 200.0) < 1e-6   # its rate is its steps since the look
    stale = drive(False)                                       # control: the old slow steps still count
    assert stale.best is False and stale.rate(True) < 100.0


def test_with_fresh_probes_the_first_modes_cold_steps_do_not_delay_the_next_look():
    """The first mode is measured first, on its coldest steps (auto's table learning from nothing): when the first
    look switches away from it, what those steps lost is not charged, so it is looked at again after `gap` steps,
    not after 1 / explore times that loss. Control: without fresh_probes the loss is charged and the next look
    waits."""
    def steps_to_next_look(fresh: bool) -> int:
        gate = BatchGate(probe_steps=4, gap=8, max_gap=64, memory=16, margin=0.0, explore=0.02, fresh_probes=fresh)
        modes = run_steps(gate, 16, 1, {True: 20.0, False: 100.0})      # cold: the first mode loses its first look
        assert gate.best is False and modes[-1] is False
        modes = run_steps(gate, 200, 1, {True: 20.0, False: 100.0})
        return modes.index(True) if True in modes else len(modes)
    assert steps_to_next_look(True) <= 8 + 1
    assert steps_to_next_look(False) > 100


def test_with_fresh_probes_a_later_switch_is_charged_as_before():
    """Only the first look's switch is free: once the first mode has won back the lead and then loses it again at a
    later look, what its steps lost is charged, and the look after that waits."""
    gate = BatchGate(probe_steps=4, gap=8, max_gap=64, memory=16, margin=0.0, explore=0.02, fresh_probes=True)
    run_steps(gate, 16, 1, {True: 20.0, False: 100.0})             # the first look switches to False, free
    run_steps(gate, 12, 1, {True: 300.0, False: 100.0})            # a look at True 8 steps on: True leads again
    assert gate.best is True
    modes = run_steps(gate, 40, 1, {True: 20.0, False: 100.0})     # True slows: a look switches to False, charged
    assert gate.best is False and not gate.first_probe
    modes = run_steps(gate, 100, 1, {True: 20.0, False: 100.0})
    assert True not in modes


def test_gate_rate_ignores_a_stalled_step():
    """A step that stalled (the OS, a collection: many steps' time) does not decide the mode."""
    gate = BatchGate()
    for _ in range(8):
        gate.record(False, 10, 1.0, 4)                 # 40 tokens/s
        gate.record(True, 11, 1.0, 4)                  # 44 tokens/s
        gate.end_step()
    gate.record(True, 1, 8.0, 4)                       # a stalled step: 0.5 tokens/s (counted, the rate: < 40)
    gate.end_step()
    assert gate.rate(True) > gate.rate(False)


def test_gate_rate_is_the_batch_rate_of_a_step():
    """Rows accept different counts: a step's rate is its rows' mean (the batch's tokens), not the median row."""
    gate = BatchGate()
    for tokens in (1, 1, 1, 9):                        # 3 rows rejected everything, one accepted 8 + 1
        gate.record(True, tokens, 1.0, 4)
    gate.end_step()
    assert gate.rate(True) == 12.0                     # 12 tokens in a second, the batch's rate


def test_gate_rate_is_tokens_over_seconds_not_the_median_steps_rate():
    """Speculation's tokens per step are skewed (most steps keep a token or two, some a whole chain):
    the median of its steps' rates sits below what it makes. Here speculation makes 5 tokens a second
    per row against plain decoding's 4, while its median step makes 2: the gate must keep speculating."""
    gate = BatchGate()
    for tokens in (2, 2, 14, 2) * 4:                 # per row, every step one second: 20 tokens in 4 s
        gate.record(True, tokens, 1.0, 4)
        gate.record(False, 4, 1.0, 4)
        gate.end_step()
    assert gate.rate(True) == 20.0 and gate.rate(False) == 16.0     # the batch's tokens over the seconds


def clocked_row(monkeypatch, **batch) -> tuple[Auto, DecodeState, list[float], list[dict]]:
    """An auto row of a batch (DecodeState fields `batch`) on a clock the test moves (now[0]: seconds),
    and what it hands its gate: one dict of BatchGate.record's arguments a recorded step."""
    import specdec.strategies.auto as auto_module
    from specdec.sampling import TorchRandom

    now, recorded = [0.0], []
    monkeypatch.setattr(auto_module, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))
    monkeypatch.setattr(BatchGate, "record", lambda self, speculated, tokens, seconds, rows, switch=False, full=True:
                        recorded.append(dict(tokens=tokens, seconds=seconds, rows=rows, full=full)))
    strategy = Auto(None, None, profile=False)
    state = DecodeState(token_ids=[5, 6], prompt_len=2, sampling=SamplingParams(), rng=TorchRandom(torch.Generator()),
                        max_depth=4, **batch)
    strategy.reset(state)
    return strategy, state, now, recorded


def test_gate_leaves_out_the_time_the_batch_spent_starting_prompts(monkeypatch):
    """Between two of a row's steps the batch may have prefilled the next prompts (DecodeState.batch_setup_s
    grows): that time is neither mode's, and the row's sample leaves it out."""
    # it joined after the batch started others
    strategy, state, now, recorded = clocked_row(monkeypatch, batch_size=4, batch_setup_s=3.0)
    for step in range(3):
        strategy._gate_modes(state)
        state.token_ids += [7, 8]                     # two tokens a step
        now[0] += 1.0                                 # one second of decoding a step...
        if step == 1:
            now[0] += 5.0                             # ... and the batch started a prompt for five more
            state.batch_setup_s += 5.0
    strategy._gate_modes(state)
    assert [(step["tokens"], step["seconds"]) for step in recorded] == [(2, 1.0), (2, 1.0), (2, 1.0)]


def test_gate_rates_come_from_full_batch_steps_only(monkeypatch):
    """A row's steps in its batch's drain (fewer rows than the batch had) are recorded as not full, and
    a step that is not full adds nothing to a mode's rate (only to the step's time)."""
    strategy, state, now, recorded = clocked_row(monkeypatch, batch_size=4)
    for rows in (4, 4, 3, 2, 2):                     # two full steps, then rows finish
        state.batch_size = rows
        strategy._gate_modes(state)
        state.token_ids += [7]
        now[0] += 1.0
    assert [(step["rows"], step["full"]) for step in recorded] == [(4, True), (4, True), (3, False), (2, False)]
    monkeypatch.undo()
    gate = BatchGate()
    gate.record(True, 4, 1.0, 4, full=False)
    gate.end_step()
    assert gate.rate(True) is None and gate.best_seconds > 0


def test_the_batch_counts_the_time_it_spends_starting_prompts():
    """decode_batch's batch_setup_s: constant between steps that start no prompt, growing by what each
    start took; a row sees it before its proposal."""
    seen = states_seen("batch_setup_s")
    assert seen[0] > 0                              # the first prompts' prefill
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert len(set(seen)) >= 4                        # every start of a freed slot added its time, and only those:
    assert len(set(seen)) <= 1 + len(PROMPTS) * 2 - 2            # one value per start at most


def test_gate_mode_changes_only_between_steps():
    """A row asking twice opens a new step; until then every row gets the same mode."""
    gate = BatchGate(probe_steps=1, gap=1, first_samples=0)
    first = [gate.mode(row) for row in (0, 1, 2)]
    second = [gate.mode(row) for row in (0, 1, 2)]
    assert len(set(first)) == 1 and len(set(second)) == 1
    assert first[0] != second[0]                      # gap 1: the next step probes the other mode


def auto_speculator(gate: bool) -> tuple[Speculator, Auto]:
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = Auto(PromptLookup(), DraftModel(noisy_copy(target), num_tokens=3), profile=False, batch_gate=gate)
    return Speculator(target, char_tokenizer(), strategy), strategy


def test_auto_in_plain_mode_proposes_nothing_and_stays_identical():
    """A gate that measured plain decoding faster: every batched step is plain (one token per row per
    forward), and each row is still HF's greedy output."""
    sd, strategy = auto_speculator(gate=True)
    for bucket in (4,):
        gate = BatchGate(gap=10 ** 6)
        gate.best = gate.speculate = False
        gate.record(True, 1, 1.0, 4)
        gate.record(False, 2, 1.0, 4)
        gate.end_step()
        strategy.batch_gates[(bucket, "greedy")] = gate
    # rows of one length: the batch never shrinks to one row (which speculates: no batch to share with)
    outs = sd.generate(PROMPTS, max_new_tokens=12, ignore_eos=True, batch_size=4)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 12, eos_token_id=None)
        assert out.stats.proposed_nodes == 0 and out.stats.target_forwards == 12


def test_auto_without_gate_speculates_in_a_batch_and_stays_identical():
    sd, strategy = auto_speculator(gate=False)
    outs = sd.generate(PROMPTS, max_new_tokens=LENGTHS, ignore_eos=True, batch_size=4)
    for prompt, out, n in zip(PROMPTS, outs, LENGTHS):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], n, eos_token_id=None)
    assert sum(out.stats.proposed_nodes for out in outs) > 0 and not strategy.batch_gates


def test_gate_measures_both_modes_in_a_real_batch():
    sd, strategy = auto_speculator(gate=True)
    outs = sd.generate(PROMPTS * 2, max_new_tokens=40, ignore_eos=True, batch_size=4)
    for prompt, out in zip(PROMPTS * 2, outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 40, eos_token_id=None)
    gate = strategy.batch_gates[(4, "greedy")]
    assert gate.rate(True) is not None and gate.rate(False) is not None


@torch.inference_mode()
def test_drop_rows_moves_the_last_rows_into_the_freed_slots():
    """Rows 1 and 2 of 5 finish: rows 3 and 4 move into their slots (then row 0 of the 3 left); every row left keeps its own
    entries (compared with the batch before the drop), and the next forward matches a batch-1 one."""
    target = tiny_model("llama", seed=1)
    batch = BatchVerifier(target, Verifier(target).layout)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16, 17, 18, 19]]
    batch.prefill(prompts, None, 64, 32)
    before = [(layer.key_buffer.clone(), layer.value_buffer.clone()) for layer in batch.cache.layers]
    fills = list(batch.fills)
    order = batch.drop_rows([1, 2])
    assert order == [0, 3, 4] and batch.rows == 3 and batch.fills == [fills[r] for r in order]
    for layer, (keys, values) in zip(batch.cache.layers, before):
        for new, old in enumerate(order):
            assert torch.equal(layer.key_buffer[new, :, :fills[old]], keys[old, :, :fills[old]])
            assert torch.equal(layer.value_buffer[new, :, :fills[old]], values[old, :, :fills[old]])
    order = [order[r] for r in batch.drop_rows([0])]                      # the last row moves to the front
    assert order == [4, 3]
    pending = [20, 21]
    logits, _ = batch.forward(pending, [CandidateTree.empty("cpu")] * 2, None)
    for new, old in enumerate(order):
        alone = target(torch.tensor([prompts[old] + [pending[new]]])).logits[0, -1]
        torch.testing.assert_close(logits[new, 0], alone, rtol=1e-4, atol=1e-4)


def test_auto_with_the_drafter_gated_off_speculates_with_lookup_alone_and_stays_identical(monkeypatch):
    """A drafter gate that measured lookup alone faster: speculating batch steps still verify lookup's
    nodes, the drafter is never called, and each row is still HF's greedy output."""
    sd, strategy = auto_speculator(gate=True)
    calls = []                                        # per row step in a batch: whether the drafter's tree came in
    real_end = Auto.propose_end

    def propose_end(self, state, tree, seconds):
        if state.batch_size > 1:                      # (one row left is no batch: no gate there)
            calls.append(tree is not None)
        return real_end(self, state, tree, seconds)

    monkeypatch.setattr(Auto, "propose_end", propose_end)
    for table, best in ((strategy.batch_gates, True), (strategy.drafter_gates, False)):
        for bucket in (2, 4):                         # the batch, and its drain once rows end at other steps
            table[(bucket, "greedy")] = gate_measured(best)
    prompts = [p * 3 for p in PROMPTS]                # text that repeats: lookup has something to copy
    outs = sd.generate(prompts, max_new_tokens=24, ignore_eos=True, batch_size=4)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 24, eos_token_id=None)
    assert sum(out.stats.proposed_nodes for out in outs) > 0
    assert strategy.drafter_gates[(4, "greedy")].best is False and calls and not any(calls)


def test_drafter_gate_measures_both_modes_in_a_real_batch():
    """With both lookup and a drafter, the speculating steps of a batch measure the drafter's calls
    against lookup alone; with lookup only (or a drafter only) there is nothing to weigh."""
    sd, strategy = auto_speculator(gate=True)
    strategy.batch_gates[(4, "greedy")] = gate_measured(True)     # every step speculates
    outs = sd.generate(PROMPTS * 2, max_new_tokens=40, ignore_eos=True, batch_size=4)
    for prompt, out in zip(PROMPTS * 2, outs):
        assert out.token_ids == hf_greedy(sd.target, sd.tokenizer(prompt)["input_ids"], 40, eos_token_id=None)
    gate = strategy.drafter_gates[(4, "greedy")]
    assert gate.rate(True) is not None and gate.rate(False) is not None
    target = tiny_model("llama", seed=1, sharpen=4.0)
    for lookup, drafter in ((PromptLookup(), None), (None, DraftModel(noisy_copy(target), num_tokens=3))):
        alone = Auto(lookup, drafter, profile=False)
        Speculator(target, char_tokenizer(), alone).generate(PROMPTS, max_new_tokens=8, ignore_eos=True, batch_size=4)
        assert alone.batch_gates and not alone.drafter_gates


def test_a_new_batch_size_starts_with_the_drafter_as_the_largest_smaller_one_measured():
    """The drafter gate of a new batch size starts without the drafter where a smaller batch size measured
    lookup alone faster, as the speculation gate does with plain decoding."""
    strategy = Auto(PromptLookup(), DraftModel(tiny_model("llama", seed=1), num_tokens=3), profile=False)
    strategy.batch_gates = {(size, "greedy"): gate_measured(True) for size in (4, 8, 16)}
    strategy.drafter_gates = {(4, "greedy"): gate_measured(False)}
    state = DecodeState(token_ids=[1, 2, 3], prompt_len=3, sampling=SamplingParams(temperature=0.0),
                        rng=None, max_depth=4, batch_size=8)
    strategy.reset(state)
    assert strategy._gate_modes(state) == (True, False)
    strategy.drafter_gates = {(4, "greedy"): gate_measured(True)}
    strategy.reset(state)
    assert strategy._gate_modes(state) == (True, True)
