"""auto's sampled depth (strategies/sampled_depth.py): when the rejection sampler verifies, the levels the
drafter samples are chosen before the draw, by expected tokens per second of a whole step."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.costmodel import CostProfile
from specdec.strategies.auto import Auto
from specdec.strategies.eagle import Eagle
from specdec.strategies.sampled_depth import MIN_SAMPLES, SampledDepth

ACCEPT = [0.8, 0.6, 0.5, 0.4]       # acceptance at levels 1..4, given the level above was kept


def measured(levels=(1, 1, 1, 1), step_s: float = 0.060, level_s: float = 0.0003, batch: int = 16,
             at_levels: int = 4) -> SampledDepth:
    """A SampledDepth that has seen chains of `levels` and MIN_SAMPLES steps at `at_levels` levels."""
    depth = SampledDepth()
    depth.note_tree([level for level, width in enumerate(levels) for _ in range(width)])
    for _ in range(MIN_SAMPLES):
        depth.record_drafting(batch, level_s * (at_levels + 1), at_levels)
        depth.record_step(batch, "mid", at_levels, step_s)
    return depth


def brute_force(step_s, level_s, batch, verify_s, anchor=4, levels=4):
    """The best depth by its definition: tokens over the anchored seconds, every depth priced."""
    rates = {}
    for depth in range(1, levels + 1):
        reach = [1.0]
        for a in ACCEPT[:depth]:
            reach.append(reach[-1] * a)
        seconds = step_s + verify_s(depth) - verify_s(anchor) + (depth - anchor) * level_s * batch
        rates[depth] = sum(reach) / seconds
    return max(rates, key=rates.get)


def test_nothing_is_chosen_before_a_depth_is_measured():
    depth = SampledDepth()
    assert depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], lambda n: 0.02 + 0.005 * n) is None
    depth.note_tree([0, 1, 2, 3])
    for _ in range(MIN_SAMPLES - 1):                    # one step short of an anchor
        depth.record_drafting(16, 0.001, 4)
        depth.record_step(16, "mid", 4, 0.06)
    assert depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], lambda n: 0.02 + 0.005 * n) is None


@pytest.mark.parametrize("slope, level_s, expected", [(0.0002, 0.00001, 4),    # memory-bound forward: all levels
                                                      (0.002, 0.0001, 3),      # compute-bound: shallower,
                                                      (0.004, 0.0002, 2),      # the more so as nodes and
                                                      (0.006, 0.0004, 1)])     # levels cost more
def test_a_compute_bound_batch_samples_shallower(slope, level_s, expected):
    verify_s = lambda n: 0.02 + slope * n                                     # noqa: E731
    depth = measured(level_s=level_s)
    chosen = depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], verify_s)
    assert chosen == expected == brute_force(0.060, level_s, 16, verify_s)


def test_the_budget_caps_the_depth_and_other_buckets_are_apart():
    verify_s = lambda n: 0.02 + 0.0002 * n                                    # noqa: E731
    depth = measured()
    assert depth.choose(16, "mid", 2, lambda j: ACCEPT[j - 1], verify_s) == 2          # max_depth 2
    assert depth.choose(4, "mid", 10, lambda j: ACCEPT[j - 1], verify_s) is None       # bucket 4: not measured
    assert depth.choose(16, "high", 10, lambda j: ACCEPT[j - 1], verify_s) is None     # another temperature


def test_every_row_of_a_step_gets_the_same_depth():
    """Chosen once per batch step (the forward is as wide as its widest row): what is recorded between
    the rows of a step changes nothing until batch_size rows have asked."""
    verify_s = lambda n: 0.02 + 0.008 * n                                     # noqa: E731
    depth = measured(level_s=0.0004)
    first = depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], verify_s)
    for _ in range(20):                                  # steps at depth 1 measured as very fast
        depth.record_step(16, "mid", 1, 0.001)
    rows = [depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], verify_s) for _ in range(15)]
    assert rows == [first] * 15
    assert depth.choose(16, "mid", 10, lambda j: ACCEPT[j - 1], verify_s) == 1      # the next step: re-chosen


def test_the_deepest_tree_sets_the_levels():
    depth = SampledDepth()
    depth.note_tree([0, 0, 1, 1, 2])
    depth.note_tree([0, 1])                              # drafted under a cap: changes nothing
    assert depth.levels == (2, 2, 1)


def test_auto_hands_its_drafter_the_chosen_depth_alone_and_in_a_batch(monkeypatch):
    """The chosen depth reaches the drafter (DecodeState.max_depth of its call) on both paths: a row
    alone (Auto.propose) and a batch's rows together (specdec.batch.propose_rows)."""
    target = tiny_model("llama", seed=3)
    strategy = Auto(None, Eagle(random_drafter(target), sampled_depth=4), profile=False, batch_gate=False)
    monkeypatch.setattr(SampledDepth, "choose", lambda self, *args: 2)
    depths = []
    real = Eagle._sampled_tree

    def spy(self, out, logits, depth_limit, state):
        depths.append(depth_limit)
        return real(self, out, logits, depth_limit, state)
    monkeypatch.setattr(Eagle, "_sampled_tree", spy)
    sd = Speculator(target, None, strategy)
    out = sd.generate([5, 6, 7, 8], max_new_tokens=12, temperature=0.8, seed=0)
    assert len(out.token_ids) > 4 and 2 in depths and set(depths) <= {1, 2}      # 1: the budget's last token
    levels = []
    import specdec.strategies.eagle_batch as eagle_batch
    real_steps = eagle_batch.sampled_tree_steps

    def batch_spy(root_probs, depth_limit, *args):
        levels.append(depth_limit)
        return real_steps(root_probs, depth_limit, *args)
    monkeypatch.setattr(eagle_batch, "sampled_tree_steps", batch_spy)
    outs = sd.generate([[5, 6, 7], [9, 10, 11, 12]], max_new_tokens=12, temperature=0.8, seed=[0, 1])
    assert all(len(o.token_ids) >= 12 for o in outs) and 2 in levels and set(levels) <= {1, 2}
    assert strategy.sampled_depth.levels == (1, 1)       # only capped chains drafted: two levels seen


def test_greedy_and_coupled_steps_choose_no_depth():
    strategy = Auto(None, None, profile=False, costs=CostProfile((0, 1), (0.02, 0.0202), 0, "test"))
    strategy.sampled_depth = measured()

    class State:
        class sampling:
            greedy, temperature = True, 0.0
        noise, batch_size, max_depth = None, 16, 10
    assert strategy._sampled_depth(State) is None
    State.sampling.greedy, State.sampling.temperature = False, 0.8
    State.noise = object()
    assert strategy._sampled_depth(State) is None
    State.noise = None
    assert strategy._sampled_depth(State) is not None
