"""The `auto` strategy: greedy identity on every test architecture with all / none / part of the
drafted nodes accepted, trees sized by the cost model, the chosen sizes reported, and loading."""
from __future__ import annotations

import random
import statistics
from collections import deque
from types import SimpleNamespace

import pytest
import torch

from conftest import hf_greedy, noisy_copy, tiny_model
from test_greedy_identity import contrarian_copy, target_of
from specdec import Speculator
from specdec.costmodel import CostProfile
from specdec.sampling import SamplingParams
from specdec.strategies.auto import PRIOR_ACCEPT, PRIOR_ACCEPT_SAMPLED, Auto, batch_bucket
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.mixed import LOOKUP, NEURAL, merge_paths
from specdec.tree import CandidateTree
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.strategies.token_recycling import TokenRecycling

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33]     # ends with a repeated 3-gram: lookup finds it
FREE = CostProfile((0, 64), (1.0, 1.0), 0, "free")  # nodes cost nothing: every node that may be kept is


def auto(drafter=None, costs=FREE, **kwargs) -> Auto:
    return Auto(PromptLookup(min_ngram=1, max_ngram=3), drafter, costs=costs, adapt_costs=False,
                draft_cost_s=0.0, **kwargs)


def run(arch: str, strategy: Auto, n: int = N):
    target = target_of(arch)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=n, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, n, eos_token_id=None)
    assert len(strategy.tree_sizes) == out.stats.target_forwards
    assert sum(strategy.tree_sizes) == out.stats.proposed_nodes
    # observe() runs after every step but the last (the loop stops there)
    assert sum(strategy.accepted_nodes.values()) == sum(out.stats.accepted_lengths[:-1])
    return out


def test_all_accepted(arch):
    strategy = auto(DraftModel(target_of(arch), num_tokens=4))
    out = run(arch, strategy)
    assert strategy.accepted_nodes[NEURAL] > 0
    assert out.stats.tokens_per_forward > 4                        # every drafted chain kept whole


def test_none_accepted(arch):
    strategy = auto(DraftModel(contrarian_copy(target_of(arch)), num_tokens=4), explore_every=1)
    run(arch, strategy)
    assert strategy.neural_calls > 0 and strategy.accepted_nodes[NEURAL] == 0


def test_partially_accepted(arch):
    strategy = auto(DraftModel(noisy_copy(target_of(arch)), num_tokens=4))
    out = run(arch, strategy)
    assert 0 < sum(out.stats.accepted_lengths) < sum(strategy.tree_sizes)


def test_lookup_alone_and_the_eos_budget():
    strategy = auto()
    run("llama", strategy, n=5)
    assert strategy.tree_sizes[0] > 0                               # the repeated 3-gram was looked up
    assert all(size <= 4 for size in strategy.tree_sizes)            # never deeper than the budget left


def test_nothing_pays_plain_decoding():
    """Nodes that cost as much as a whole plain step never pay: auto proposes nothing."""
    costly = CostProfile((0, 1), (1.0, 2.0), 0, "costly")
    strategy = auto(DraftModel(target_of("llama"), num_tokens=4), costs=costly)
    out = run("llama", strategy)
    assert strategy.tree_sizes == [0] * N and out.stats.tokens_per_forward == 1.0


def test_measured_profile_at_bind(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    target = target_of("llama")
    strategy = Auto(PromptLookup(), DraftModel(target, num_tokens=4), profile_context=16, max_nodes=8)
    Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=8, ignore_eos=True)
    assert strategy.costs.key and strategy.costs.sizes == tuple(range(9))    # every size up to max_nodes
    assert strategy.draft_cost_s is not None and strategy.draft_cost_s > 0     # measured as it ran
    assert len(list((tmp_path / "profiles").iterdir())) == 1


def test_calibration_sizes_the_tree():
    """A node costs a tenth of a plain step: a perfect drafter's chains are kept, a contrarian's
    are dropped once calibration has seen them fail (it carries across calls), and a drafter that
    costs time is then rarely even called."""
    tenth = CostProfile((0, 1), (1.0, 1.1), 0, "linear")
    target = target_of("llama")
    good = auto(DraftModel(target, num_tokens=4), costs=tenth)
    Speculator(target, None, good).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert good.tree_sizes[1:-2].count(4) >= len(good.tree_sizes) - 4
    bad = auto(DraftModel(contrarian_copy(target), num_tokens=4), costs=tenth)
    bad.draft_cost_s = 0.3                                           # drafting costs 0.3 plain steps a call
    sd = Speculator(target, None, bad)
    first = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    calls = bad.neural_calls
    later = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert bad.accepted_nodes[NEURAL] == 0
    assert first.stats.proposed_nodes > later.stats.proposed_nodes
    assert bad.neural_calls - calls < later.stats.target_forwards // 2   # the drafter is rarely even called


def test_load_auto_with_a_draft(tmp_path, monkeypatch):
    import specdec
    from conftest import char_tokenizer
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    tok = char_tokenizer()
    for model, name in ((target, "target"), (draft, "draft")):
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    sd = specdec.load("auto", **{"target.path": str(tmp_path / "target"), "draft.path": str(tmp_path / "draft"),
                                 "auto.profile_context": 16, "auto.max_nodes": 8})
    assert isinstance(sd.strategy, Auto) and isinstance(sd.strategy.drafter, DraftModel)
    out = sd.generate("abcabcab", max_new_tokens=8)
    assert len(out.token_ids) == 8 and len(sd.strategy.tree_sizes) == out.stats.target_forwards
    by_name = Speculator(target, tok, "auto")              # by name: no trained drafter, so the target's own table
    assert isinstance(by_name.strategy.drafter, TokenRecycling)
    assert by_name.generate("abcabcab", max_new_tokens=8).token_ids == out.token_ids
    untrained = specdec.load("auto", **{"target.path": str(tmp_path / "target"), "auto.profile_context": 16,
                                        "auto.max_nodes": 8})
    assert isinstance(untrained.strategy.drafter, TokenRecycling)
    assert untrained.strategy.drafter.costs is untrained.strategy.costs     # one profile, auto's
    assert specdec.load("auto", **{"target.path": str(tmp_path / "target"), "auto.drafter": "none",
                                   "auto.profile": False}).strategy.drafter is None
    alone = specdec.load("auto", **{"target.path": str(tmp_path / "target"), "draft.path": str(tmp_path / "draft"),
                                    "auto.lookup": False, "auto.profile": False})
    assert alone.strategy.lookup is None
    assert alone.generate("abcabcab", max_new_tokens=8).token_ids == out.token_ids   # greedy: the same text


def test_profile_command(tmp_path, monkeypatch, capsys):
    from specdec.cli import main
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    tiny_model("gpt2", seed=0).save_pretrained(tmp_path / "target")
    from conftest import char_tokenizer
    char_tokenizer().save_pretrained(tmp_path / "target")
    code = main(["profile", "auto", f"target.path={tmp_path / 'target'}", "auto.max_nodes=4", "auto.profile_context=8",
                 "--max-new-tokens", "6", "--prompt", "abab"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "nodes  seconds" in printed and "tree sizes chosen per step" in printed
    assert len(list((tmp_path / "home" / "profiles").iterdir())) == 1


def test_the_drafter_is_called_by_lookup_context():
    """A drafter that pays where lookup offers nothing but not beside a long lookup match is
    called in the first context every step and only to re-explore in the second."""
    from specdec.strategies.auto import _lookup_context
    target = target_of("llama")
    strategy = auto(DraftModel(target, num_tokens=4))
    state = type("State", (), {"max_depth": 8})()
    # planned (expected tokens, nodes) with the drafter / with lookup alone, per context; every tree
    # costs 1 (FREE), drafting nothing: planned tokens/s 2 vs 1 in context 0, 1 vs 3 in context 2
    nothing, long_match = ("greedy", 0), ("greedy", 2)      # (temperature kind, what lookup offers)
    strategy.plan_with = {nothing: (2.0, 3), long_match: (1.0, 3)}
    strategy.plan_without = {nothing: (1.0, 0), long_match: (3.0, 4)}
    calls = {context: sum(strategy._call_drafter(state, context) for _ in range(40)) for context in (nothing, long_match)}
    assert calls[nothing] == 40
    assert 1 <= calls[long_match] <= 40 // strategy.explore_every        # gaps that double: a few looks only
    # contexts: nothing kept / expected lookup gain under one token / more
    parents, accept = (-1, 0, 1), [0.9, 0.9, 0.9]
    assert _lookup_context(parents, accept, []) == 0
    assert _lookup_context(parents, [0.5, 0.2, 0.1], [0]) == 1
    assert _lookup_context(parents, accept, [0, 1, 2]) == 2


def test_planned_rates_are_priced_at_the_costs_known_when_deciding():
    """A plan made while the drafter looked dear (its first call catches up on the whole prompt)
    must not keep it uncalled once its cost is known to be low: the plan's expected tokens and
    size are kept, and priced at the current costs on every decision."""
    target = target_of("llama")
    strategy = auto(DraftModel(target, num_tokens=4))
    state = type("State", (), {"max_depth": 8})()
    context = ("greedy", 0)
    strategy.plan_with, strategy.plan_without = {context: (2.0, 3)}, {context: (1.0, 0)}
    strategy.draft_cost_s = 3.0                                         # 2 tokens / (1 + 3): 0.5 < 1
    assert strategy.planned_rates(context) == pytest.approx((0.5, 1.0))
    assert sum(strategy._call_drafter(state, context) for _ in range(40)) <= 40 // strategy.explore_every
    strategy.draft_cost_s = 0.0                                         # the same plan, drafting now free
    assert strategy.planned_rates(context) == pytest.approx((2.0, 1.0))
    assert all(strategy._call_drafter(state, context) for _ in range(20))
    slow = CostProfile((0, 64), (1.0, 65.0), 0, "slow")                 # a node costs a plain step
    strategy.costs = slow
    assert strategy.planned_rates(context) == pytest.approx((2.0 / 4.0, 1.0))   # 3 nodes now cost 4


def test_the_drafter_cost_is_timed_after_the_first_call():
    """The first call of a generation catches the drafter up on the whole prompt; its time must not
    stand for a drafting call's: the next step calls again and that time replaces it."""
    target = target_of("llama")
    strategy = Auto(PromptLookup(min_ngram=1, max_ngram=3), DraftModel(target, num_tokens=2), costs=FREE,
                    explore_every=8)
    strategy.calibrator.prior = 1e9                      # frozen estimates: the plan never pays for the drafter
    Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=12, ignore_eos=True)
    assert strategy.cost_known and strategy.neural_calls >= 2
    assert 1 <= len(strategy.draft_times) <= strategy.neural_calls - 1     # every call but the first may price it


@pytest.mark.parametrize("sampled_confidence,kind", [(False, "depth"), (True, "conf")])
def test_sampled_drafter_nodes_are_estimated_per_depth_unless_asked_by_confidence(sampled_confidence, kind):
    import torch
    strategy = auto(None, sampled_confidence=sampled_confidence)
    tree = CandidateTree(torch.tensor([3, 4]), (-1, 0), torch.full((2, 8), 1 / 8))      # a sampled chain
    state = type("State", (), {"sampling": SamplingParams(0.8)})()
    keys = strategy._node_keys(tree, [NEURAL, NEURAL], state)
    assert [key[2] for key, _ in keys] == [kind, kind]
    assert all((confidence is None) == (kind == "depth") for _, confidence in keys)


def test_lookup_prior_is_lower_when_sampling():
    """Before calibration, a lookup token is estimated at PRIOR_ACCEPT when greedy but at the lower
    PRIOR_ACCEPT_SAMPLED when sampling (a point mass is kept with probability p(x) only)."""
    tree, source = merge_paths(CandidateTree.empty(), [[5, 6, 7]])
    strategy = Auto(PromptLookup(), None, profile=False)
    greedy, _ = strategy._estimates(tree, source, SimpleNamespace(sampling=SamplingParams(0.0)))
    sampled, _ = strategy._estimates(tree, source, SimpleNamespace(sampling=SamplingParams(0.8)))
    assert greedy == pytest.approx([PRIOR_ACCEPT[LOOKUP][0]] + [PRIOR_ACCEPT[LOOKUP][1]] * 2)
    assert sampled == pytest.approx([PRIOR_ACCEPT_SAMPLED[LOOKUP][0]] + [PRIOR_ACCEPT_SAMPLED[LOOKUP][1]] * 2)
    assert sampled[0] < greedy[0] and sampled[1] < greedy[1]


def _merged_tree():
    """A drafter's root children 3, 4, 8 (ranks 0, 1, 2) and 3's child 7, then lookup's paths [5, 6] and [3, 9]:
    5 is a lookup child beside the drafter's, 9 a second child of 3 (after the drafter's 7)."""
    drafted = CandidateTree(torch.tensor([3, 4, 8, 7]), (-1, -1, -1, 0))
    return merge_paths(drafted, [[5, 6], [3, 9]])


def test_nodes_are_ranked_among_their_own_source_and_marked_where_sources_meet():
    from specdec.strategies.auto import source_ranks
    tree, source = _merged_tree()
    assert tree.tokens.tolist() == [3, 4, 8, 7, 5, 6, 9]
    assert source == [NEURAL] * 4 + [LOOKUP] * 3
    ranks, mixed = source_ranks(tree, source)
    assert ranks == [0, 1, 2, 0, 0, 0, 0]           # 5: lookup's first root child, though the fourth child
    assert mixed == [True] * 5 + [False, True]        # 6 has no sibling; 7 and 9 meet under 3


def test_later_siblings_and_meeting_sources_are_calibrated_apart():
    """Before calibration a sibling's estimate falls with its rank among its own source's; after it, what the
    drafter's third child and lookup's child beside the drafter's were seen to keep moves their own estimates
    only, not the drafter's first child's, nor lookup's child where lookup drafts alone."""
    tree, source = _merged_tree()
    strategy = auto(None)
    greedy = SimpleNamespace(sampling=SamplingParams(0.0))
    accept, keys = strategy._estimates(tree, source, greedy)
    first = PRIOR_ACCEPT[NEURAL][0]
    assert accept[:3] == pytest.approx([first, first / 4, first / 9])
    assert len({key for key, _ in keys}) == len(keys)          # 7 nodes, 7 estimates kept apart
    lookup_alone, lookup_beside = keys[5][0], keys[4][0]        # 6 (depth 1, alone), 5 (depth 0, beside the drafter's)
    for _ in range(50):
        strategy.calibrator.record(keys[2][0], False)
        strategy.calibrator.record(lookup_beside, False)
    after, _ = strategy._estimates(tree, source, greedy)
    assert after[2] < accept[2] / 5 and after[4] < accept[4] / 5
    assert after[0] == accept[0] and after[1] == accept[1] and after[5] == accept[5]
    plain, plain_source = merge_paths(CandidateTree.empty(), [[5, 6]])      # lookup alone: its own records
    assert strategy._estimates(plain, plain_source, greedy)[0][0] == pytest.approx(PRIOR_ACCEPT[LOOKUP][0])


class SpyDrafter:
    """A neural drafter stand-in: proposes the target's own next token (one node, always accepted, so
    lookup's nodes below it are tried too) and records every StepResult it observes."""
    name = "spy"
    needs_hidden_states = True

    def __init__(self, target):
        self.target = target
        self.proposed: list[CandidateTree] = []
        self.observed: list = []

    def bind(self, target, tokenizer): pass

    def reset(self, state):
        self.proposed, self.observed = [], []

    @torch.inference_mode()
    def propose(self, state):
        token = int(self.target(torch.tensor([state.token_ids])).logits[0, -1].argmax())
        self.proposed.append(CandidateTree.chain([token]))
        return self.proposed[-1]

    def observe(self, state, result):
        self.observed.append(result)


@pytest.mark.parametrize("explore_every", [1, 2])
def test_the_drafter_observes_its_own_tree_with_its_own_rows(explore_every):
    """Every StepResult auto hands its drafter keeps types.StepResult's promise: `accepted` is a root
    path of that drafter's own tree (or of an empty one), `hidden` holds the target's features of
    exactly the pending token's row and those nodes' rows, and next_token is the token after them;
    one after the other they cover every committed row once, in order."""
    target = tiny_model("llama", seed=2, sharpen=4.0)
    spy = SpyDrafter(target)
    strategy = auto(spy, explore_every=explore_every)
    prompt = [5, 17, 33, 9, 41] * 3
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=N, ignore_eos=True)
    ids = prompt + out.token_ids
    with torch.inference_mode():
        features = target(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]   # [len, H]
    followed = 0                             # drafter verdicts followed by a token lookup added after them
    committed = len(prompt)
    for i, result in enumerate(spy.observed):
        assert result.committed_before == committed                     # every row once, in order
        assert result.num_accepted == 0 or any(result.tree is tree for tree in spy.proposed)
        parents = [-1] + list(result.accepted[:-1]) if result.accepted else []
        assert [result.tree.parents[node] for node in result.accepted] == parents        # a root path
        path_tokens = [int(result.tree.tokens[node]) for node in result.accepted]
        assert ids[committed: committed + result.num_accepted + 1] == path_tokens + [result.next_token]
        assert result.hidden.shape[0] == 1 + result.num_accepted
        rows = features[committed - 1: committed + result.num_accepted]  # the pending token's row, then the path's
        assert torch.allclose(result.hidden, rows, atol=1e-4)
        committed += result.num_accepted + 1
        if result.num_accepted and i + 1 < len(spy.observed) and spy.observed[i + 1].tree.num_nodes == 0:
            followed += 1
    assert committed == len(ids) - out.stats.accepted_lengths[-1] - 1    # all but the last step's run
    assert followed > 0, "precondition: lookup nodes were accepted below the drafter's"


@pytest.mark.parametrize("planned_for,expect_calls", [("greedy", True), ("mid", False)])
def test_greedy_plans_do_not_decide_sampled_steps(planned_for, expect_calls):
    """Plans are kept per temperature kind: lookup that wins beside the drafter on greedy requests
    (edited copies of a prompt) mostly fails when sampling, so greedy plans saying 'lookup alone pays
    more' must not keep the drafter uncalled at T = 0.8. Control: the same plans made at T = 0.8
    do keep it uncalled but for looks."""
    target = target_of("llama")
    strategy = auto(DraftModel(target, num_tokens=4), explore_every=8)
    for context in range(3):           # 'lookup alone makes 5 tokens a step, the drafter 1'
        strategy.plan_with[(planned_for, context)] = (1.0, 4)
        strategy.plan_without[(planned_for, context)] = (5.0, 4)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=40, ignore_eos=True,
                                                       temperature=0.8, seed=0)
    steps = out.stats.target_forwards
    if expect_calls:
        assert strategy.neural_calls >= steps - 1
    else:
        assert strategy.neural_calls <= steps // 2


def test_a_drafter_priced_out_is_timed_again_on_its_looks():
    """A drafter whose cost was measured high (a busy minute, a slow call) is called on looks only;
    every look (a catch-up call after the gap) is followed by a steady call whose time is recorded,
    so the estimate comes back down. Before, looks were never timed and the drafter stayed priced
    out for good."""
    target = target_of("llama")
    strategy = Auto(PromptLookup(min_ngram=1, max_ngram=3), DraftModel(target, num_tokens=4), costs=FREE,
                    explore_every=2, draft_cost_s=100.0)
    strategy.draft_times.extend([100.0] * 9)            # 100 s a call: rate 5 / 101 against lookup's 1 / 1
    # the looks at a drafter that loses follow one schedule per temperature kind (not one per lookup context):
    # a generation long enough for five of them
    Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=400, ignore_eos=True)
    timed = [t for t in strategy.draft_times if t < 100.0]
    assert len(timed) >= 5 and strategy.draft_cost_s < 1.0


def test_batch_bucket_is_the_power_of_two_at_or_above():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]


# ---------------------------------------------------------------------- what the drafter's calls did
def test_matched_length_is_what_the_kept_part_alone_would_accept():
    """Lookup's own plan, verified alone: the kept nodes that the committed tokens walk down from the
    root (a dropped node stops the walk; at most the committed tokens: nothing after them is known)."""
    from specdec.strategies.auto import matched_length
    tokens, parents = [7, 8, 9, 5, 6], [-1, 0, 1, -1, 3]       # paths 7 8 9 and 5 6
    assert matched_length(tokens, parents, [0, 1, 2, 3, 4], [7, 8, 4]) == 2
    assert matched_length(tokens, parents, [0, 1, 3, 4], [7, 8, 9, 1]) == 2    # 9 was not kept
    assert matched_length(tokens, parents, [0, 1, 2, 3, 4], [5, 6]) == 2        # all known tokens matched
    assert matched_length(tokens, parents, [0, 1, 2], [5, 6]) == 0
    assert matched_length(tokens, parents, [], [7]) == 0


def dear_nodes(per_node: float) -> CostProfile:
    """Verify costs where every tree node adds per_node of a plain step."""
    return CostProfile((0, 64), (1.0, 1.0 + 64 * per_node), 0, "dear nodes")


@pytest.mark.parametrize("drafter_kind", ["oracle", "contrarian"])
def test_a_drafter_is_judged_by_what_its_calls_kept_not_by_its_plan(drafter_kind):
    """The drafter alone (no lookup: its calls are judged against plain decoding), with calibration frozen
    at its prior, so every plan says its chain pays (each node kept at 0.7). A drafter that always drafts
    the target's own tokens does pay, and is called on nearly every step; one that never drafts them keeps
    nothing more than a plain step, so what its calls did prices it out but for its looks, though its plans
    keep saying it pays. Both are greedy-identical."""
    target = target_of("llama")
    draft = target if drafter_kind == "oracle" else contrarian_copy(target)
    strategy = Auto(None, DraftModel(draft, num_tokens=4), costs=dear_nodes(0.05), adapt_costs=False,
                    draft_cost_s=0.3)                              # a call costs 0.3 plain steps (not re-measured)
    strategy.calibrator.prior = 1e9
    out = run("llama", strategy, n=96)
    steps = out.stats.target_forwards
    if drafter_kind == "oracle":
        assert strategy.neural_calls >= steps - 1
    else:
        assert strategy.accepted_nodes[NEURAL] == 0
        assert strategy.planned_loss(("greedy", 0)) is None         # what the plan says...
        assert strategy.measured_loss(("greedy", 0)) > 0            # ...and what the calls did
        assert strategy.neural_calls <= steps // 4


def test_calls_that_clearly_paid_overrule_a_plan_that_says_they_lose():
    """The mirror of the test above: calibration frozen at its prior (each node kept at 0.7) and nodes dear
    enough (half a plain step each) that every plan says a call loses to plain decoding, while a drafter that
    always drafts the target's own tokens keeps every node the planner verifies (2 of its 4, at 2.3 steps' cost:
    3 tokens). Once its calls in a context clearly paid, the plan no longer keeps it uncalled there: it is called
    on most steps. Greedy-identical."""
    target = target_of("llama")
    strategy = Auto(None, DraftModel(target, num_tokens=4), costs=dear_nodes(0.5), adapt_costs=False,
                    draft_cost_s=0.3)
    strategy.calibrator.prior = 1e9
    out = run("llama", strategy, n=160)
    steps = out.stats.target_forwards
    assert strategy.planned_loss(("greedy", 0)) > 0                  # what the plan says...
    assert strategy.measured_loss(("greedy", 0)) is None             # ...and what the calls did
    assert strategy.neural_calls >= 0.75 * steps, (strategy.neural_calls, steps)


def test_looks_at_a_dear_drafter_are_spaced_by_what_a_call_loses():
    """Calls that kept nothing more than lookup alone: a drafter that costs a tenth of a step a call is
    looked at every MAX_EXPLORE_GAP steps once the gap has doubled up to it; one that costs ten steps, every
    priced_gap steps, so its looks cost LOOK_SHARE of the time; once its calls pay, it is called again."""
    from specdec.strategies.auto import CALL_MEMORY, LOOK_CALLS, LOOK_SHARE, MAX_EXPLORE_GAP, priced_gap
    state = type("State", (), {"max_depth": 8})()
    context = ("greedy", 2)
    gaps = {}
    for draft_cost in (0.1, 10.0):
        strategy = auto(DraftModel(target_of("llama"), num_tokens=4))
        strategy.draft_cost_s = draft_cost
        # (tokens kept, nodes verified, tokens lookup alone would have kept, its nodes): nothing gained
        strategy.call_values[context] = deque([(3, 4, 3, 4)] * CALL_MEMORY, maxlen=CALL_MEMORY)
        looks = [step for step in range(3000) if strategy._call_drafter(state, context)]
        gaps[draft_cost] = (looks[-1] - looks[-2], strategy.measured_loss(context))
        strategy.draft_cost_s = 0.0                        # now its calls are cheap and keep more: they pay
        strategy.call_values[context] = deque([(5, 4, 3, 4)] * CALL_MEMORY, maxlen=CALL_MEMORY)
        assert all(strategy._call_drafter(state, context) for _ in range(10))
    (cheap_gap, cheap_loss), (dear_gap, dear_loss) = gaps[0.1], gaps[10.0]
    assert cheap_loss == pytest.approx(0.1) and dear_loss == pytest.approx(10.0)    # FREE verify: a call's cost
    assert cheap_gap == MAX_EXPLORE_GAP
    assert dear_gap == priced_gap(dear_loss) > MAX_EXPLORE_GAP
    assert LOOK_CALLS * dear_loss / dear_gap <= LOOK_SHARE


@pytest.mark.parametrize("drafter,settings", [
    ("lookahead", ["lookahead.window=3", "lookahead.ngram=3", "lookahead.guesses=2"]),
    ("early_exit", ["early_exit.exit_layer=1"]),
    ("layer_skip", ["layer_skip.attention=[0]", "layer_skip.mlp=[1]"]),
])
@pytest.mark.parametrize("draft_cost", [0.0, 5.0])
def test_self_drafters_in_the_menu_stay_identical_whether_called_or_priced_out(drafter, settings, draft_cost):
    """auto with lookahead, early_exit or layer_skip as its drafter: free, it is called; dear (five plain
    steps a call), it is priced out between looks, so steps switch between calling it and not. Either
    way the text is Hugging Face's greedy one."""
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    target = target_of("llama")
    cfg = load_spec_config("auto", [f"auto.drafter={drafter}", "auto.profile=false", *settings])
    strategy = build_strategy(cfg, target, None, target.device, target.dtype)
    strategy.costs, strategy.adapt_costs, strategy.draft_cost_s = dear_nodes(0.05), False, draft_cost
    sd = Speculator(target, None, strategy)
    steps = 0
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=48, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 48, eos_token_id=None)
        steps += out.stats.target_forwards
    assert strategy.neural_calls > 0
    if draft_cost:
        assert strategy.neural_calls <= steps // 3


@pytest.mark.parametrize("explore_every", [1, 2])
def test_an_eagle_in_auto_feeds_every_committed_row_its_own_next_token(explore_every):
    """EAGLE's committed rows are fed (at its next catch-up) the target's feature at a position and the
    token after it. Where auto's lookup adds tokens after the drafter's own accepted nodes (or on a step
    without the drafter), each of those rows' next tokens is the one committed there, not the step's
    new pending token: a wrong one there gave the drafter a context unlike eagle alone's."""
    from eagle_helpers import random_drafter
    from specdec.strategies.eagle import Eagle
    target = tiny_model("llama", seed=2, sharpen=4.0)
    eagle = Eagle(random_drafter(target), max_nodes=3, depth=2)
    fed, from_device = [], 0
    take_unfed = eagle.take_unfed

    def recorded(token_ids):
        nonlocal from_device
        from_device += bool(eagle.unfed_tokens)        # a list of device tokens, not None (the host's)
        start = eagle.fed
        taken = take_unfed(token_ids)
        if taken is not None:
            fed.append((taken[1].tolist(), token_ids[start + 1: start + 1 + len(taken[1])]))
        return taken
    eagle.take_unfed = recorded
    strategy = auto(eagle, explore_every=explore_every)
    prompt = [5, 17, 33, 9, 41] * 3
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, prompt, N, eos_token_id=None)
    assert strategy.accepted_nodes[LOOKUP] > 0 and from_device > 0, "precondition: lookup's tokens, device tokens"
    assert all(tokens == committed for tokens, committed in fed)


def test_a_loss_within_the_calls_noise_is_not_judged_a_loss():
    """clear_loss: calls whose mean gain is below zero by less than MEASURED_MARGIN standard errors are not
    judged to lose; the same mean with no spread, or with the same spread over many more calls, is."""
    from specdec.strategies.auto import MEASURED_MARGIN, clear_loss
    noisy = [kept - 2.5 for kept in (1, 5, 1, 4, 2, 1, 4, 1)]      # sampled calls, break-even 2.5: mean -0.125
    assert statistics.fmean(noisy) < 0
    assert not clear_loss(noisy)
    assert clear_loss([statistics.fmean(noisy)] * len(noisy))       # no spread: any loss is clear
    many = noisy * 2000                                            # standard error shrinks as 1 / sqrt(calls)
    assert statistics.stdev(many) / len(many) ** 0.5 * MEASURED_MARGIN < 0.125 and clear_loss(many)
    assert not clear_loss([0.0] * 8) and not clear_loss([0.5, 1.5, 0.5])


def test_clear_loss_is_the_mean_against_its_standard_error():
    """clear_loss computes in floats what the statistics module defines (auto asks it of each drafter every step,
    and statistics.stdev sums exact fractions): the same verdict on random windows of calls, at and off the
    margin."""
    from specdec.strategies.auto import MEASURED_MARGIN, clear_loss
    rng = random.Random(0)
    for _ in range(2000):
        gains = [rng.gauss(rng.uniform(-1.0, 0.5), rng.uniform(0.0, 2.0)) for _ in range(rng.randint(2, 32))]
        error = statistics.stdev(gains) / len(gains) ** 0.5
        assert clear_loss(gains) == (statistics.fmean(gains) + MEASURED_MARGIN * error < 0)


@pytest.mark.parametrize("kept,called", [
    ((1, 5, 1, 4, 2, 1, 4, 1) * 2, True),     # sampled calls: about what pays, far apart from call to call
    ((2,) * 16, False),                       # every call keeps 2: a clear loss
])
def test_sampled_calls_that_lose_within_their_noise_keep_the_drafter_called(kept, called):
    """Calls at T = 0.8 keep 1 to depth + 1 tokens each. A window of them whose mean falls a little short of
    paying (break-even here: 2.5 tokens a call; their mean: 2.375) keeps the drafter called on every step;
    calls that all keep 2 price it out but for its looks. Plans say it pays either way."""
    from specdec.strategies.auto import CALL_MEMORY
    state = type("State", (), {"max_depth": 8})()
    context = ("mid", 0)
    strategy = auto(DraftModel(target_of("llama"), num_tokens=4), costs=dear_nodes(0.25))   # 4 nodes: 2 steps
    strategy.draft_cost_s = 0.5                                                        # a call: half a step
    strategy.plan_with[context], strategy.plan_without[context] = (3.0, 4), (1.0, 0)
    # (tokens kept, nodes verified, tokens lookup alone would have kept, its nodes): lookup had nothing
    strategy.call_values[context] = deque([(k, 4, 1, 0) for k in kept], maxlen=CALL_MEMORY)
    rate_with, rate_alone, _, _ = strategy.measured_rates(context)
    assert rate_with < rate_alone                           # both windows lose on their mean
    calls = sum(strategy._call_drafter(state, context) for _ in range(40))
    assert (calls == 40) if called else (calls <= 4)
