"""What a speculative step keeps from one step to the next so as not to compute it again, and that what it
keeps is what it would have computed: auto's calibration keys per tree shape (the estimates still follow the
calibration), its verify prices within one proposal, the empty tree, a select that keeps every node, a merge
with no paths."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from conftest import hf_greedy, tiny_model
from specdec import Speculator
from specdec.costmodel import CostProfile
from specdec.sampling import SamplingParams
from specdec.strategies.auto import Auto
from specdec.strategies.mixed import NEURAL, merge_paths
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.token_recycling import TokenRecycling
from specdec.tree import CandidateTree, LowerRun

LINEAR = CostProfile((0, 64), (1.0, 2.0), 0, "linear")     # each node costs 1/64 of a plain step


def random_merged_tree(rng: random.Random) -> tuple[CandidateTree, list[str]]:
    """A drafter's random tree with random lookup paths merged below it."""
    parents: list[int] = []
    for i in range(rng.randint(0, 9)):
        parents.append(rng.randint(-1, i - 1))
    drafted = CandidateTree(torch.tensor([rng.randint(3, 12) for _ in parents], dtype=torch.long), tuple(parents))
    paths = [[rng.randint(3, 12) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(0, 3))]
    return merge_paths(drafted, paths)


def test_kept_keys_are_the_keys_computed_afresh():
    """One Auto keeps the keys of every shape it meets: random merged trees, each met again under other drafter
    names, table-chain nodes, suffix match lengths and temperatures. What it returns for each, once all are kept,
    is what an Auto that keeps nothing computes (_node_keys's keys and the priors)."""
    rng = random.Random(0)
    kept = Auto(PromptLookup(), None, costs=LINEAR, profile=False)
    cases = []
    for _ in range(30):
        tree, source = random_merged_tree(rng)
        for _ in range(4):               # the same shape in other settings: keys must not leak between them
            chain = tuple(i for i in range(tree.num_nodes) if source[i] == NEURAL and rng.random() < 0.3)
            cases.append((tree, source, rng.choice([NEURAL, "neural:token_recycling"]), chain,
                          rng.choice([None, 3, 9, 40]), SimpleNamespace(sampling=SamplingParams(rng.choice([0.0, 0.3, 0.8])))))
    for tree, source, neural, chain, match, state in cases:
        kept.match_length = match
        kept._keys_and_priors(tree, source, state, neural, chain)
    assert len(kept.keys_by_shape) > 30
    for tree, source, neural, chain, match, state in cases:
        fresh = Auto(PromptLookup(), None, costs=LINEAR, profile=False)
        kept.match_length = fresh.match_length = match
        expected = fresh._keys_and_priors(tree, source, state, neural, chain)
        again = kept._keys_and_priors(tree, source, state, neural, chain)
        assert again == expected
        assert again is kept._keys_and_priors(tree, source, state, neural, chain)     # read from what was kept
        assert [pair for pair, _ in expected] == fresh._node_keys(tree, source, state, neural, chain)


def test_estimates_from_kept_keys_follow_the_calibration():
    """The keys are kept, not the estimates: records made between two steps on the same shape move the second
    step's estimates."""
    strategy = Auto(PromptLookup(), None, costs=LINEAR, profile=False)
    tree, source = merge_paths(CandidateTree(torch.tensor([3, 4]), (-1, 0)), [[5, 6]])
    greedy = SimpleNamespace(sampling=SamplingParams(0.0))
    before, keys = strategy._estimates(tree, source, greedy)
    assert len(strategy.keys_by_shape) == 1
    for _ in range(40):
        strategy.calibrator.record(keys[1][0], False)
    after, again = strategy._estimates(tree, source, greedy)
    assert again == keys
    assert after[1] < before[1] / 4 and after[0] == before[0]


def test_a_sampled_tree_keyed_by_its_confidences_is_not_kept():
    """Keys read from draft probabilities (sampled_confidence) change with them: such a tree's keys are
    computed every time and nothing is kept for its shape."""
    strategy = Auto(PromptLookup(), None, costs=LINEAR, profile=False, sampled_confidence=True)
    state = SimpleNamespace(sampling=SamplingParams(0.8))
    sure = CandidateTree(torch.tensor([3, 4]), (-1, 0), torch.tensor([[0.0] * 3 + [1.0] + [0.0] * 4,
                                                                       [0.0] * 4 + [1.0] + [0.0] * 3]))
    unsure = CandidateTree(torch.tensor([3, 4]), (-1, 0), torch.full((2, 8), 1 / 8))
    first = strategy._estimates(sure, [NEURAL, NEURAL], state)[1]
    second = strategy._estimates(unsure, [NEURAL, NEURAL], state)[1]
    assert strategy.keys_by_shape == {}
    assert [key for key, _ in first] != [key for key, _ in second]


def test_verify_prices_hold_within_a_proposal_only():
    """Within a proposal each size is priced once (cost_scale and the profile hold until the step's observe);
    outside one, and at the next proposal, a new cost_scale is what verify_cost prices with."""
    target = tiny_model("llama", seed=0)
    strategy = Auto(PromptLookup(), TokenRecycling(costs=LINEAR), costs=LINEAR, adapt_costs=False, draft_cost_s=0.0)
    sd = Speculator(target, None, strategy)
    prices: list[tuple[float, float]] = []
    propose_end = Auto.propose_end

    def spied_end(self, state, tree, drafted_s):
        priced = self.verify_cost(8)
        assert priced == self._verify_cost(8) and self.verify_cost(2.5) == self._verify_cost(2.5)
        self.cost_scale *= 2.0                  # mid-proposal: not seen before the next one
        prices.append((priced, self.verify_cost(8)))
        self.cost_scale /= 2.0
        return propose_end(self, state, tree, drafted_s)

    Auto.propose_end = spied_end
    try:
        out = sd.generate([5, 6, 7, 5, 6, 7, 5, 6], max_new_tokens=8, ignore_eos=True)
    finally:
        Auto.propose_end = propose_end
    assert out.token_ids == hf_greedy(target, [5, 6, 7, 5, 6, 7, 5, 6], 8, eos_token_id=None)
    assert prices and all(a == b for a, b in prices)
    assert strategy.step_costs is None
    base = strategy.verify_cost(8)
    strategy.cost_scale *= 3.0
    assert strategy.verify_cost(8) == pytest.approx(3.0 * base)


def test_select_of_every_node_is_the_tree_itself():
    tree = CandidateTree(torch.tensor([3, 4, 5]), (-1, 0, 0), torch.full((3, 8), 1 / 8))
    assert tree.select([0, 1, 2]) is tree
    part = tree.select([0, 2])
    assert part.tokens.tolist() == [3, 5] and part.parents == (-1, 0) and part.draft_probs.shape == (2, 8)
    ahead = CandidateTree(torch.tensor([3, 4]), (-1, 0), lower_run=LowerRun(1, torch.zeros(1, 4), None))
    kept = ahead.select([0, 1])
    assert kept is not ahead and kept.lower_run is None and kept.tokens.tolist() == [3, 4]


def test_the_empty_tree_is_one_per_device_and_works_in_and_out_of_inference_mode():
    empty = CandidateTree.empty("cpu")
    assert CandidateTree.empty("cpu") is empty and empty.num_nodes == 0 and empty.tokens.dtype == torch.long
    assert CandidateTree.empty(torch.device("cpu")).tokens.device == empty.tokens.device
    meta = CandidateTree.empty("meta")          # a device named without an index: made anew each time
    assert meta.tokens.device.type == "meta" and CandidateTree.empty("meta") is not meta
    with torch.inference_mode():
        assert CandidateTree.empty("cpu") is empty
    grown = torch.cat([empty.tokens, torch.tensor([7])])
    assert grown.tolist() == [7] and not empty.tokens.is_inference()


def test_merging_no_paths_gives_the_tree_itself():
    tree = CandidateTree(torch.tensor([3, 4]), (-1, 0))
    merged, source = merge_paths(tree, [])
    assert merged is tree and source == [NEURAL, NEURAL]
    merged, source = merge_paths(tree, [[3, 9]])
    assert merged.tokens.tolist() == [3, 4, 9] and merged.parents == (-1, 0, 0)
