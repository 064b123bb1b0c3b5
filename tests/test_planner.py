"""The planner behind `auto` (strategies/planner.py), its calibration, the cost model
(specdec/costmodel.py) and mixed-tree merging (strategies/mixed.py): pure functions, no generation."""
from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from conftest import tiny_model
from specdec.costmodel import CostProfile, load_or_measure, measure_verify_costs, profile_dir
from specdec.tree import INDEPENDENT, WITHOUT_REPLACEMENT, CandidateTree
from specdec.strategies.mixed import LOOKUP, NEURAL, merge_paths
from specdec.strategies.planner import Calibrator, path_reach, plan


# ---------------------------------------------------------------------- planner vs brute force
def random_tree(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(-1, i) for i in range(n))


def closed(subset: set[int], parents) -> bool:
    return all(parents[i] == -1 or parents[i] in subset for i in subset)


def brute_force(parents, accept, cost, draft_cost, max_nodes, forced=()):
    """The best rate over every prefix-closed subset that holds `forced` (at most max_nodes
    nodes besides what forced needs)."""
    reach = path_reach(parents, accept)
    best = None
    for size in range(len(parents) + 1):
        for subset in itertools.combinations(range(len(parents)), size):
            chosen = set(subset)
            if not set(forced) <= chosen or not closed(chosen, parents):
                continue
            if len(chosen - set(forced)) > max(0, max_nodes - len(set(forced))):
                continue
            rate = (1 + sum(reach[i] for i in chosen)) / (cost(len(chosen)) + draft_cost)
            best = rate if best is None else max(best, rate)
    return best


# x a plain step for 0..8 nodes, measured on the pycode target (2-core CPU, 15 rounds): 1-3 nodes
# cost more than 4-5 (specdec/costmodel.py)
MEASURED_CPU_COSTS = (1.0, 1.31, 1.43, 1.43, 1.19, 1.16, 1.24, 1.29, 1.39)


@pytest.mark.parametrize("seed", range(40))
def test_plan_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 9)
    parents = random_tree(rng, n)
    accept = [rng.choice([0.0, 0.05, 0.3, 0.5, 0.9, 1.0, rng.random()]) for _ in range(n)]
    slope, curve = rng.choice([0.0, 0.05, 0.3, 1.0, 3.0]), rng.choice([1.0, 1.5])
    cost = lambda k: 1.0 + slope * k ** curve                      # noqa: E731
    if seed % 4 == 1:                                  # measured costs are not monotone in the size
        cost = MEASURED_CPU_COSTS.__getitem__
    draft_cost = rng.choice([0.0, 0.2, 1.0])
    max_nodes = rng.choice([n, max(1, n // 2), 2])
    forced = ()
    if seed % 3 == 0:                                  # a forced sub-tree: the first root child's subtree
        forced = tuple(i for i in range(n) if _under(parents, i, 0))
    keep, rate = plan(parents, accept, cost, draft_cost, max_nodes, forced)
    assert closed(set(keep), parents) and set(forced) <= set(keep)
    assert len(set(keep) - set(forced)) <= max(0, max_nodes - len(forced))
    reach = path_reach(parents, accept)
    assert rate == pytest.approx((1 + sum(reach[i] for i in keep)) / (cost(len(keep)) + draft_cost))
    assert rate == pytest.approx(brute_force(parents, accept, cost, draft_cost, max_nodes, forced))


def one_path(subset: set[int], parents) -> bool:
    """Whether `subset` is one path from the root: closed under parents, no two nodes of one parent."""
    parents_in = [parents[i] for i in subset]
    return closed(subset, parents) and len(parents_in) == len(set(parents_in))


def brute_force_chain(parents, accept, cost, draft_cost, max_nodes, forced=()):
    """The best rate over every path from the root (the empty one included when nothing is forced) that
    holds `forced`; None when none does."""
    reach = path_reach(parents, accept)
    best = None if forced else 1.0 / (cost(0) + draft_cost)
    for size in range(1, len(parents) + 1):
        for subset in itertools.combinations(range(len(parents)), size):
            chosen = set(subset)
            if not set(forced) <= chosen or not one_path(chosen, parents) or len(chosen) > max(max_nodes, len(forced)):
                continue
            rate = (1 + sum(reach[i] for i in chosen)) / (cost(len(chosen)) + draft_cost)
            best = rate if best is None else max(best, rate)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_chain_plan_is_the_brute_force_optimum(seed):
    """plan(chain=True), for a target verified on chains: the best single path; forced nodes that are
    not on one path leave nothing verified (plain decoding)."""
    rng = random.Random(1000 + seed)
    n = rng.randrange(1, 9)
    parents = random_tree(rng, n)
    accept = [rng.choice([0.0, 0.05, 0.3, 0.5, 0.9, 1.0, rng.random()]) for _ in range(n)]
    slope = rng.choice([0.0, 0.05, 0.3, 1.0])
    cost = (lambda k: 1.0 + slope * k) if seed % 4 != 1 else MEASURED_CPU_COSTS.__getitem__
    draft_cost = rng.choice([0.0, 0.2, 1.0])
    max_nodes = rng.choice([n, max(1, n // 2), 2])
    forced = ()
    if seed % 3 == 0:                                  # the first root child's subtree: a path only sometimes
        forced = tuple(i for i in range(n) if _under(parents, i, 0))
    keep, rate = plan(parents, accept, cost, draft_cost, max_nodes, forced, chain=True)
    expected = brute_force_chain(parents, accept, cost, draft_cost, max_nodes, forced)
    if expected is None:
        assert keep == [] and rate == pytest.approx(1.0 / (cost(0) + draft_cost))
        return
    assert one_path(set(keep), parents) and set(forced) <= set(keep)
    reach = path_reach(parents, accept)
    assert rate == pytest.approx((1 + sum(reach[i] for i in keep)) / (cost(len(keep)) + draft_cost))
    assert rate == pytest.approx(expected)


def test_chain_plan_takes_one_branch_where_the_tree_plan_takes_both():
    """Nearly free nodes: the tree plan keeps both branches, the chain plan the better one whole."""
    parents, accept = (-1, 0, -1, 2, 3), [0.6, 0.6, 0.7, 0.9, 0.9]
    cost = lambda k: 1.0 + 0.01 * k                    # noqa: E731
    assert plan(parents, accept, cost)[0] == [0, 1, 2, 3, 4]
    assert plan(parents, accept, cost, chain=True)[0] == [2, 3, 4]


def _under(parents, node: int, root: int) -> bool:
    while node != -1:
        if node == root:
            return True
        node = parents[node]
    return False


def test_plan_prefers_a_cheaper_larger_tree():
    """With measured, non-monotone costs a 4-node chain beats its 2-node prefix, which costs more."""
    parents, accept = (-1, 0, 1, 2), [0.8, 0.5, 0.2, 0.1]
    keep, rate = plan(parents, accept, MEASURED_CPU_COSTS.__getitem__)
    assert keep == [0, 1, 2, 3]
    reach = path_reach(parents, accept)
    two = (1 + reach[0] + reach[1]) / MEASURED_CPU_COSTS[2]
    assert rate > two                                  # 2 nodes expect more per node but cost more


def test_plan_proposes_nothing_when_nothing_pays():
    parents, accept = (-1, 0, 0), [0.3, 0.3, 0.3]
    keep, rate = plan(parents, accept, lambda n: 1.0 + 0.5 * n)
    assert keep == [] and rate == 1.0
    keep, _ = plan(parents, accept, lambda n: 1.0 + 0.01 * n)    # nearly free nodes: all of them
    assert keep == [0, 1, 2]


# ---------------------------------------------------------------------- calibration
def test_calibration_moves_from_the_raw_confidence_to_the_observed_rate():
    cal = Calibrator(prior=4.0)
    key = cal.key("neural", 0.8, 0.9, depth=0)
    assert cal.estimate(key, 0.9, 0.5) == pytest.approx(0.9)      # no observations: the raw confidence
    for i in range(200):
        cal.record(key, i % 4 == 0)                               # a quarter kept
    assert 0.2 < cal.estimate(key, 0.9, 0.5) < 0.35                # a quarter, nudged by the prior (0.9)
    for i in range(200):
        cal.record(key, True)                                     # the text changed: now all kept
    assert cal.estimate(key, 0.9, 0.5) > 0.95                     # old observations faded
    assert cal.key("neural", 0.0, 0.9, 0) != key                  # per temperature
    assert cal.key("lookup", 0.8, 0.9, 0) != key                  # per drafter
    assert cal.key("neural", 0.8, 0.35, 0) != key                 # per confidence bucket
    assert cal.key("lookup", 0.0, None, 2) == ("lookup", "greedy", "depth", 2)


# ---------------------------------------------------------------------- cost model
def test_cost_profile_interpolates_and_extends():
    profile = CostProfile((0, 2, 4), (1.0, 1.2, 2.0), 16)
    assert profile.verify_cost(0) == 1.0
    assert profile.verify_cost(1) == pytest.approx(1.1)
    assert profile.verify_cost(3) == pytest.approx(1.6)
    assert profile.verify_cost(6) == pytest.approx(2.8)           # the last slope, extended
    assert (profile.verify_cost(2), profile.verify_cost(4)) == pytest.approx((1.2, 2.0))   # measured sizes as measured
    assert profile.verify_cost(-1) == 1.0
    assert profile.relative() == pytest.approx([1.0, 1.2, 2.0])


def test_measured_costs_are_kept_as_measured(monkeypatch):
    """Medians per size, not forced to grow with the size: a clock that makes 1 node dearer than 4
    (as on the CPU the profile's docstring cites) is read back as such."""
    durations = {0: [1.0, 9.0, 1.2], 1: [3.0, 3.1, 2.9], 4: [2.0, 2.2, 50.0]}    # per size, per round
    ticks = []
    for round_ in range(3):
        for n in (0, 1, 4):
            ticks += [0.0, durations[n][round_]]
    clock = iter(ticks)
    monkeypatch.setattr("specdec.costmodel._now", lambda device: next(clock))
    profile = measure_verify_costs(tiny_model("llama", seed=0), (0, 1, 4), context_len=5, repeats=3)
    assert profile.seconds == (1.2, 3.0, 2.2)                     # the median of each size; 1 > 4 kept


def test_measured_profile_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    model = tiny_model("llama", seed=0)
    profile = load_or_measure(model, (0, 1, 4), context_len=8, repeats=1)
    assert profile.sizes == (0, 1, 4) and all(s > 0 for s in profile.seconds)
    files = list((tmp_path / "profiles").iterdir())
    assert len(files) == 1 and profile_dir() == str(tmp_path / "profiles")
    data = json.loads(files[0].read_text())
    data["seconds"] = [7.0, 8.0, 9.0]                             # the cache is what is read back
    files[0].write_text(json.dumps(data))
    assert load_or_measure(model, (0, 1, 4), context_len=8, repeats=1).seconds == (7.0, 8.0, 9.0)
    assert load_or_measure(model, (0, 1, 4), context_len=8, repeats=1, refresh=True).seconds != (7.0, 8.0, 9.0)
    other = tiny_model("llama", seed=1)                           # another target: another key
    assert load_or_measure(other, (0, 1, 4), context_len=8, repeats=1).key != profile.key


def test_measurement_leaves_no_trace_in_a_fresh_verifier():
    model = tiny_model("gpt2", seed=0)
    profile = measure_verify_costs(model, (0, 3), context_len=5, repeats=1)
    assert profile.context_len == 5 and len(profile.seconds) == 2


# ---------------------------------------------------------------------- merging
def test_merge_shares_prefixes_and_puts_lookup_after_neural_siblings():
    probs = torch.softmax(torch.randn(3, 7), -1)                  # [3, V]
    neural = CandidateTree(torch.tensor([4, 5, 6]), (-1, -1, 0), probs, WITHOUT_REPLACEMENT)
    merged, source = merge_paths(neural, [[4, 6, 1], [2, 3], [5]])
    assert merged.tokens.tolist() == [4, 5, 6, 1, 2, 3]
    assert merged.parents == (-1, -1, 0, 2, -1, 4)
    assert source == [NEURAL] * 3 + [LOOKUP] * 3
    assert merged.siblings == WITHOUT_REPLACEMENT
    assert torch.equal(merged.draft_probs[:3], probs)
    assert torch.equal(merged.draft_probs[3:], torch.nn.functional.one_hot(torch.tensor([1, 2, 3]), 7).float())
    assert merged.children(-1) == (0, 1, 4)                       # neural siblings first
    capped, _ = merge_paths(neural, [[4, 6, 1], [2, 3]], max_nodes=5)
    assert capped.num_nodes == 5


def test_merge_of_point_masses_stays_point_masses():
    merged, source = merge_paths(CandidateTree.empty(), [[1, 2], [1, 3]])
    assert merged.draft_probs is None and merged.siblings == INDEPENDENT
    assert merged.parents == (-1, 0, 0) and source == [LOOKUP] * 3
