"""The per-step time split of a call (prefill / draft / verify / other) puts each part of a step where it
belongs and adds up to the call's total: checked with a clock that only moves when a part is run."""
from __future__ import annotations

import types

import pytest

import specdec
import specdec.loop
from conftest import char_tokenizer, noisy_copy, tiny_model
from specdec.strategies.draft_model import DraftModel
from specdec.types import Stats

# seconds each part adds to the fake clock (distinct powers of two: a part counted twice or in the
# wrong bucket shows up in the sums)
PREFILL, PROPOSE, FORWARD, COMMIT, OBSERVE = 64.0, 1.0, 8.0, 0.25, 2.0


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _advancing(fn, clock: FakeTime, seconds: float):
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        clock.now += seconds
        return out
    return wrapped


@pytest.mark.parametrize("strategy", ["autoregressive", "draft_model"])
def test_split_puts_each_part_in_its_bucket_and_adds_up(monkeypatch, strategy):
    target = tiny_model("llama", seed=0, sharpen=3.0)
    chosen = DraftModel(noisy_copy(target, 0.3), num_tokens=3) if strategy == "draft_model" else strategy
    sd = specdec.Speculator(target, char_tokenizer(), chosen)
    clock = FakeTime()
    monkeypatch.setattr(specdec.loop, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    verifier, strat = sd.verifier, sd.strategy
    monkeypatch.setattr(verifier, "prefill_outputs", _advancing(verifier.prefill_outputs, clock, PREFILL))
    monkeypatch.setattr(verifier, "forward", _advancing(verifier.forward, clock, FORWARD))
    monkeypatch.setattr(verifier, "commit", _advancing(verifier.commit, clock, COMMIT))
    monkeypatch.setattr(strat, "propose", _advancing(strat.propose, clock, PROPOSE))
    observed = []
    monkeypatch.setattr(strat, "observe", _advancing(lambda *a: observed.append(strat.__class__.observe(strat, *a)),
                                                     clock, OBSERVE))
    out = sd.generate("def f(x):\n    return", max_new_tokens=12)
    s = out.stats
    steps = s.target_forwards
    assert steps >= 2 and len(observed) in (steps - 1, steps)        # the last step may finish instead
    assert s.prefill_time_s == PREFILL
    assert s.verify_time_s == steps * FORWARD
    assert s.draft_time_s == steps * PROPOSE + len(observed) * OBSERVE
    assert s.other_time_s == steps * COMMIT
    assert s.prefill_time_s + s.draft_time_s + s.verify_time_s + s.other_time_s == s.total_time_s
    split = s.step_split()                                  # per verify step, in milliseconds
    assert split.draft_ms * steps == pytest.approx(1e3 * s.draft_time_s)
    assert split.verify_ms == pytest.approx(1e3 * FORWARD) and split.other_ms == pytest.approx(1e3 * COMMIT)
    assert (split.draft_ms + split.verify_ms + split.other_ms + split.prefill_ms) * steps == pytest.approx(
        1e3 * s.total_time_s)
    assert split.nodes == s.proposed_nodes / steps
    second = sd.generate("class A:\n    pass", max_new_tokens=7).stats
    both = Stats.summed([s, second])                        # two calls as one: sums, not means of means
    assert both.target_forwards == steps + second.target_forwards
    assert both.total_time_s == pytest.approx(s.total_time_s + second.total_time_s)
    assert both.accepted_lengths == s.accepted_lengths + second.accepted_lengths
    assert both.step_split().verify_ms == pytest.approx(1e3 * FORWARD)
    assert both.tokens_per_forward == (s.new_tokens + second.new_tokens) / both.target_forwards


def test_verify_against_plain_times_both_forwards_on_the_same_context():
    """`specdec profile`'s side-by-side: every size timed both ways (the plain forward's cache is cropped
    back each time, so a later size still runs on the same context)."""
    from specdec.profile import verify_against_plain
    target = tiny_model("llama", seed=0)
    rows = verify_against_plain(target, (0, 3, 6), context_len=10, repeats=2)
    assert [n for n, _, _ in rows] == [0, 3, 6]
    assert all(verify_s > 0 and plain_s > 0 for _, verify_s, plain_s in rows)
