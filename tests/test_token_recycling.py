"""token_recycling: the table update (every row of a forward, rejected nodes included, nothing else),
the breadth-first tree read from the table, the shape the cost model picks, the scopes, the errors,
the verifier's top-k interface it rides on, and exactness through the real loop (greedy identity on
every identity architecture, one sequence and a ragged batch). The output laws under the rejection
and coupled samplers are in test_law_end_to_end.py and test_coupled.py."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_ragged_batch_greedy_identical, char_tokenizer, hf_greedy, tiny_model
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.costmodel import CostProfile
from specdec.errors import ConfigError
from specdec.sampling import SamplingParams, TorchRandom
from specdec.strategies.base import BaseStrategy
from specdec.strategies.token_recycling import (Shape, TokenRecycling, best_first, breadth_first, draft_tokens,
                                                gathered_tokens, plan_shape, reads_on_host, recycle, shape_index)
from specdec.tree import CandidateTree
from specdec.types import DecodeState, StepResult
from specdec.verifier import Verifier

PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33]
CHEAP = CostProfile((0, 64), (1.0, 1.2), 0, "test")       # a node costs little: trees pay
N = 24


def recycler(**settings) -> TokenRecycling:
    return TokenRecycling(costs=settings.pop("costs", CHEAP), **settings)


def state_of(tokens, scope=None, max_depth=16, prompt_top_ids=None, temperature=0.0) -> DecodeState:
    return DecodeState(token_ids=list(tokens), prompt_len=len(tokens), sampling=SamplingParams(temperature),
                       rng=TorchRandom(torch.Generator()), max_depth=max_depth, cache_scope=scope,
                       prompt_top_ids=prompt_top_ids)


# ---------------------------------------------------------------------- the table
def test_a_step_overwrites_every_rows_token_and_no_other_row():
    """A hand-made step: pending token 7, a tree of 4 nodes (tokens 3, 9, 4, 11), the path 3 -> 4
    accepted and 9, 11 rejected. Every one of the five tokens' rows becomes the top-k of its row of
    the forward; every other row stays as it was."""
    vocab, k = 16, 3
    table = torch.arange(vocab * k).reshape(vocab, k)
    before = table.clone()
    tree = CandidateTree(torch.tensor([3, 9, 4, 11]), (-1, -1, 0, 1))
    input_ids = torch.tensor([7, 3, 9, 4, 11])                                  # [pending] + tree
    top_ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15]])
    strategy = recycler(k=k)
    strategy.table = table
    strategy.observe(state_of([0, 7]), StepResult(tree, (0, 2), 5, 2, None, top_ids, input_ids))
    for row, token in enumerate(input_ids.tolist()):
        assert table[token].tolist() == top_ids[row].tolist()
    untouched = [t for t in range(vocab) if t not in input_ids.tolist()]
    assert torch.equal(table[untouched], before[untouched])


def test_a_token_held_by_several_rows_takes_the_last_one():
    table = torch.zeros(8, 2, dtype=torch.long)
    recycle(table, torch.tensor([5, 3, 5, 1]), torch.tensor([[1, 1], [2, 2], [3, 3], [4, 4]]))
    assert table[5].tolist() == [3, 3] and table[3].tolist() == [2, 2] and table[1].tolist() == [4, 4]


def test_steps_observed_at_once_leave_the_table_as_steps_observed_in_turn():
    """auto hands its drafter one step as several (drafter_steps): the table's one write for all their rows
    (observe_steps) leaves what observing them one by one leaves, where a token is held by rows of two steps
    (5, in steps one and three) and by two rows of one step (3, in step one), and steps without top-k rows."""
    vocab, k = 16, 2
    tree = CandidateTree(torch.tensor([3, 5, 3]), (-1, 0, 1))
    steps = [StepResult(tree, (0, 1), 9, 2, None, torch.tensor([[1, 2, 0], [3, 4, 0], [5, 6, 0], [7, 8, 0]]),
                        torch.tensor([7, 3, 5, 3])),
             StepResult(CandidateTree.empty(), (), 4, 4, None, None, None),
             StepResult(CandidateTree.empty(), (), 6, 5, None, torch.tensor([[9, 10, 0]]), torch.tensor([5])),
             StepResult(CandidateTree.empty(), (), 2, 6, None, torch.tensor([[11, 12, 0]]), torch.tensor([6]))]
    tables = []
    for at_once in (False, True):
        strategy = recycler(k=k)
        strategy.table = torch.arange(vocab * k).reshape(vocab, k)
        strategy.draft_s = 0.0
        if at_once:
            strategy.observe_steps(state_of([0, 7]), steps)
        else:
            for step in steps:
                strategy.observe(state_of([0, 7]), step)
        tables.append(strategy.table)
    assert torch.equal(tables[0], tables[1])
    assert tables[1][5].tolist() == [9, 10] and tables[1][3].tolist() == [7, 8] and tables[1][6].tolist() == [11, 12]


def test_the_prefill_seeds_the_prompts_rows():
    """reset() writes the prefill's top-k after each prompt token (but the pending one) into that
    token's row: a cold table drafts from the prompt's own predictions at once."""
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = recycler(k=4)
    strategy.bind(target, None)
    prefilled = Verifier(target).prefill_outputs(PROMPT[:-1], top_k=4)
    strategy.reset(state_of(PROMPT, prompt_top_ids=prefilled.top_ids))
    logits = target(torch.tensor([PROMPT[:-1]])).logits[0]                         # [P - 1, V]
    last = {token: row for row, token in enumerate(PROMPT[:-1])}                    # repeated tokens: the last row
    for token, row in last.items():
        assert strategy.table[token].tolist() == logits[row].topk(4).indices.tolist()
    untouched = [t for t in range(strategy.table.shape[0]) if t not in last]
    assert int(strategy.table[untouched].abs().sum()) == 0                     # a cold table: zeros elsewhere


# ---------------------------------------------------------------------- the tree
def test_the_tree_is_filled_breadth_first_from_the_table():
    """Each node holds its parent's token's row read at its rank; the root's parent is the pending token."""
    table = torch.tensor([[(10 * t + r) % 50 for r in range(3)] for t in range(50)])
    shape = Shape((-1, -1, 0, 0, 1, 2, 4), (0, 1, 0, 2, 1, 0, 1))
    tokens = draft_tokens(table, torch.tensor([7]), shape_index(shape, "cpu")).tolist()
    held = []
    for parent, rank in zip(shape.parents, shape.ranks):
        parent_token = 7 if parent == -1 else held[parent]
        held.append(int(table[parent_token, rank]))
    assert tokens == held == [20, 21, 0, 2, 11, 0, 11]


def test_a_cpu_table_read_on_the_host_drafts_what_the_device_gather_drafts():
    """On a CPU the tree is read from the table node by node on the host (reads_on_host); it holds what the
    per-level gather that other devices run holds, over random tables and random breadth-first shapes."""
    generator = torch.Generator().manual_seed(3)
    for trial in range(40):
        vocab, k = 5 + trial, 1 + trial % 4
        table = torch.randint(0, vocab, (vocab, k), generator=generator)
        if trial % 2:                                   # a view of another layout: read as it is laid out
            table = torch.randint(0, vocab, (k, vocab), generator=generator).t()
        parents, ranks, _ = best_first(lambda depth, rank: 0.9 / (1 + rank + depth), k, 1 + trial % 13, 1 + trial % 5)
        index = shape_index(breadth_first(parents, ranks, list(range(len(parents)))), "cpu")
        pending = torch.randint(0, vocab, (1,), generator=generator)
        assert reads_on_host(table)
        on_host = draft_tokens(table, pending, index)
        assert on_host.dtype == torch.long and on_host.shape == (len(parents),)
        assert on_host.tolist() == gathered_tokens(table, pending, index).tolist()


def test_best_first_then_breadth_first_order():
    """The planner's nodes are the rank paths of highest reach; the shape lists them level by level,
    each level in its parents' order, then by rank (levels contiguous, parents before children)."""
    rates = {0: 0.8, 1: 0.3, 2: 0.1}
    parents, ranks, kept = best_first(lambda depth, rank: rates[rank], 3, 6, 8)
    # reaches: 0.8 (rank 0), 0.64 (0, 0), 0.512, 0.4096, 0.32768 (a chain of five rank-0 nodes), then 0.3 (rank 1)
    assert (parents, ranks) == ([-1, 0, 1, 2, 3, -1], [0, 0, 0, 0, 0, 1])
    assert kept == [0.8, 0.8, 0.8, 0.8, 0.8, 0.3]
    shape = breadth_first(parents, ranks, list(range(6)))
    assert shape.parents == (-1, -1, 0, 2, 3, 4) and shape.ranks == (0, 1, 0, 0, 0, 0)
    assert [shape.depths()[i] for i in range(6)] == sorted(shape.depths())
    assert shape.levels() == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    assert shape.cut(2) == Shape((-1, -1, 0), (0, 1, 0))


def test_the_cost_model_chooses_the_shape():
    """Cheap nodes: a large tree; nodes that cost as much as a plain step: none (plain decoding)."""
    accept = lambda depth, rank: 0.6 / (1 + rank) ** 2                     # noqa: E731
    cheap = plan_shape(accept, 8, 32, 8, lambda n: 1.0 + 0.002 * n)
    dear = plan_shape(accept, 8, 32, 8, lambda n: 1.0 + 1.0 * n)
    middling = plan_shape(accept, 8, 32, 8, lambda n: 1.0 + 0.05 * n)
    assert len(cheap.parents) == 32 and dear.parents == ()
    assert 0 < len(middling.parents) < 32
    assert max(middling.ranks) < max(cheap.ranks)          # low ranks first: the cheaper tree keeps fewer siblings


def test_a_batch_row_plans_with_the_batch_costs():
    """In a batch, a row's tree is sized by its share of the batch forward's cost (the profile of the batch's
    bucket, as auto's): where a node costs a row as much as its plain step, no tree; alone, the cheap one-row
    profile's tree."""
    steep = CostProfile((0, 64), (1.0, 65.0), 0, "test")
    strategy = recycler(profile=True)
    strategy.batch_costs.update({2: steep, 4: steep})          # measured already: nothing is measured here
    strategy.bind(tiny_model("llama", seed=0), None)
    alone = strategy.plan(state_of(PROMPT))
    state = state_of(PROMPT)
    state.batch_size = 3                                       # the profile of 4
    assert len(alone.parents) > 0 and strategy.plan(state).parents == ()
    assert sorted(strategy.batch_costs) == [2, 4]
    assert recycler(profile=False).costs_at(4) is CHEAP        # no profile: the one-row costs (a guess)


def test_the_shape_follows_the_calibrated_acceptance():
    """After steps where rank 0 is always kept, the planned tree is a deeper chain-like tree than
    after steps where nothing is kept."""
    def planned(kept_first: bool) -> Shape:
        strategy = recycler(k=4, max_nodes=16)
        for _ in range(200):
            for depth in range(4):
                for rank in range(4):
                    key = strategy.calibrator.key(f"recycle{rank}", 0.0, None, depth)
                    strategy.calibrator.record(key, kept_first and rank == 0)
        return strategy.plan(state_of(PROMPT))
    good, bad = planned(True), planned(False)
    assert max(good.depths()) > max(bad.depths(), default=-1)


def test_nodes_a_strategy_around_it_did_not_verify_are_not_counted_as_tried():
    """Inside auto the table's tree is planned with lookup's and only part of it verified (StepResult.verified):
    a node never verified was not tried, so it must not count as rejected. Shape: ranks 0, 1 at the root and rank
    0 below the first; the path to node 2 accepted; auto verified nodes 0 and 2 only."""
    def tried(verified):
        strategy = recycler(k=2)
        shape = Shape((-1, -1, 0), (0, 1, 0))
        tree = CandidateTree(torch.tensor([3, 4, 5]), shape.parents)
        strategy.drafted = (shape, tree)
        strategy.calibrate(StepResult(tree, (0, 2), 6, 2, verified=verified), 0.0)
        return {key[0] + str(key[3]): (strategy.calibrator.tried[key], strategy.calibrator.kept[key])
                for key in strategy.calibrator.tried}
    assert tried(None) == {"recycle00": (1, 1), "recycle10": (1, 0), "recycle01": (1, 1)}
    assert tried((0, 2)) == {"recycle00": (1, 1), "recycle01": (1, 1)}      # rank 1 was never verified


def test_auto_tells_its_drafter_which_of_its_nodes_it_verified():
    from specdec.strategies.auto import drafter_steps
    neural = CandidateTree(torch.tensor([3, 4, 5]), (-1, -1, 0))
    state = state_of([1, 2, 3, 5, 8])                  # committed: 3 (node 0), 5 (node 2), then the target's 8
    steps = drafter_steps(state, StepResult(neural, (0, 1), 8, 2), accepted=[0, 2], neural_tree=neural,
                          merged_kept=[0, 2, 3])       # node 1 pruned by auto; 3 is a lookup node
    assert steps[0].verified == (0, 2) and steps[0].num_verified == 2 and steps[0].accepted == (0, 2)


# ---------------------------------------------------------------------- scopes and errors
def test_scopes_never_share_a_table():
    target = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = recycler()
    sd = Speculator(target, None, strategy)
    sd.generate(PROMPT, max_new_tokens=12, ignore_eos=True, cache_scope="a")
    learned = strategy.store.scopes["a"].clone()
    assert set(strategy.store.scopes) == {"a"} and int(learned.abs().sum()) > 0
    # a call in another scope starts from a cold table (seeded by its own prompt only)
    fresh = strategy.for_call()
    fresh.reset(state_of([3, 4], scope="b"))
    assert int(fresh.table.abs().sum()) == 0
    sd.generate([40, 41, 42], max_new_tokens=12, ignore_eos=True, cache_scope="b")
    assert set(strategy.store.scopes) == {"a", "b"}
    assert torch.equal(strategy.store.scopes["a"], learned)                 # b's call left a's table alone
    again = strategy.for_call()
    again.reset(state_of([3, 4], scope="a"))
    assert torch.equal(again.table, learned) and again.table is not learned  # a call drafts from its own copy
    strategy.forget()
    assert strategy.store.scopes == {}


def test_k_larger_than_the_vocabulary_is_refused():
    target = tiny_model("llama", seed=1, vocab=16)
    with pytest.raises(ConfigError, match=r"k = 17 is larger than the target's vocabulary \(16 tokens\).*k <= 16"):
        Speculator(target, None, recycler(k=17))
    Speculator(target, None, recycler(k=16))


@pytest.mark.parametrize("key, value", [("k", 0), ("max_depth", 0), ("replan_every", 0), ("k", 2.5)])
def test_bad_settings_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=f"token_recycling.{key}"):
        TokenRecycling(**{key: value})


def test_config_section_and_defaults():
    cfg = load_spec_config("token_recycling", {"token_recycling.k": 4})
    assert cfg.strategy == "token_recycling" and cfg.token_recycling.k == 4
    defaults = load_spec_config("token_recycling").token_recycling
    strategy = TokenRecycling()
    assert (strategy.k, strategy.max_nodes, strategy.max_depth, strategy.replan_every) == (
        defaults.k, defaults.max_nodes, defaults.max_depth, defaults.replan_every)
    with pytest.raises(ConfigError, match="token_recycling"):
        load_spec_config("token_recycling", {"token_recycling.kk": 4})


# ---------------------------------------------------------------------- the verifier's top-k
class TopK(BaseStrategy):
    """Proposes a fixed two-level tree and records what the verifier returns."""
    name = "topk_probe"

    def __init__(self, k: int):
        self.top_k_ids, self.results, self.prompt_top = k, [], None

    def reset(self, state):
        self.prompt_top = state.prompt_top_ids

    def propose(self, state):
        if state.max_depth < 2:
            return CandidateTree.empty()
        return CandidateTree(torch.tensor([3, 4, 5]), (-1, -1, 0))

    def observe(self, state, result):
        self.results.append((list(state.token_ids[:result.committed_before]), result))


@pytest.mark.parametrize("k", [0, 3])
def test_step_results_carry_every_rows_top_k_only_when_asked(k):
    target = tiny_model("llama", seed=1)
    probe = TopK(k)
    Speculator(target, None, probe).generate(PROMPT, max_new_tokens=6, ignore_eos=True)
    assert probe.results
    if k == 0:
        assert probe.prompt_top is None and all(r.top_ids is None and r.input_ids is None for _, r in probe.results)
        return
    logits = target(torch.tensor([PROMPT[:-1]])).logits[0]
    assert probe.prompt_top.tolist() == logits.topk(k).indices.tolist()
    for context, result in probe.results:
        assert result.input_ids.tolist() == [context[-1]] + result.tree.tokens.tolist()
        for row, node in enumerate([-1] + list(range(result.tree.num_nodes))):
            path = [] if node == -1 else [result.tree.tokens[n].item() for n in _path(result.tree, node)]
            row_logits = target(torch.tensor([context + path])).logits[0, -1]
            assert result.top_ids[row].tolist() == row_logits.topk(k).indices.tolist()


def _path(tree, node):
    path = [node]
    while tree.parents[path[-1]] != -1:
        path.append(tree.parents[path[-1]])
    return path[::-1]


# ---------------------------------------------------------------------- exactness through the loop
def test_greedy_identity(arch):
    """Two calls on one Speculator (the second drafts from the table the first left), and prompts that
    repeat themselves: steps accept the whole tree, part of it, or nothing."""
    target = tiny_model(arch, seed=0)
    strategy = recycler()
    sd = Speculator(target, None, strategy)
    forwards = []
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
        forwards.append(out.stats)
    assert sum(sum(s.accepted_lengths) for s in forwards) > 0           # drafts were kept
    assert any(s.proposed_nodes > sum(s.accepted_lengths) for s in forwards)   # and rejected
    assert sum(strategy.calibrator.tried.values()) > 0                  # the verdicts calibrated the shape planner


def test_greedy_identity_ragged_batch(arch):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    assert_ragged_batch_greedy_identical(Speculator(target, char_tokenizer(), recycler()))


# ---------------------------------------------------------------------- inside auto
def test_auto_with_token_recycling_is_greedy_identical_and_feeds_the_table():
    """auto.drafter = token_recycling: auto merges its tree with prompt lookup's, prices it by its
    measured drafting cost, and the table still learns from every step (the drafter's rows, then one
    row per token committed after them)."""
    from specdec.strategies.auto import Auto
    target = tiny_model("llama", seed=1, sharpen=4.0)
    cfg = load_spec_config("auto", {"auto.drafter": "token_recycling", "auto.profile": False,
                                    "token_recycling.profile": False})
    from specdec.strategies.auto import from_config
    strategy = from_config(cfg, target, None, target.device, target.dtype)
    assert isinstance(strategy, Auto) and isinstance(strategy.drafter, TokenRecycling) and strategy.top_k_ids == 8
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
    table = strategy.drafter.store.scopes["default"]
    # every committed token's row was written (the last one's is the pending row of no forward yet)
    for token in set(PROMPT[::-1] + PROMPT + out.token_ids[:-1]):
        assert int(table[token].abs().sum()) > 0
    assert strategy.neural_calls > 0 and strategy.accepted_nodes["neural"] > 0


# ---------------------------------------------------------------------- SAM-Decoding's rule
def test_sam_copies_long_matches_else_recycles_and_is_greedy_identical(arch):
    from specdec.strategies.prompt_lookup import PromptLookup
    from specdec.strategies.sam import Sam
    target = tiny_model(arch, seed=0)
    strategy = Sam(PromptLookup(min_ngram=5, max_ngram=8), recycler())
    sd = Speculator(target, None, strategy)
    prompt = [40, 41, 42, 43, 44, 45, 46, 47, 3, 9, 40, 41, 42, 43, 44]       # ends with a 5-token match
    out = sd.generate(prompt, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
    assert strategy.copied[0] and not all(strategy.copied)                     # both parts drafted
    table = strategy.recycling.store.scopes["default"]
    assert all(int(table[t].abs().sum()) > 0 for t in set(prompt + out.token_ids[:-1]))   # learned every step


def test_sam_by_name():
    cfg = load_spec_config("sam", {"sam.min_match": 4})
    from specdec.strategies.sam import from_config
    strategy = from_config(cfg, None, None, "cpu", torch.float32)
    assert strategy.lookup.min_ngram == 4 and strategy.lookup.max_ngram == 8 and strategy.top_k_ids == 8
