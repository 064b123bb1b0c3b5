"""strategies/leaf_chain.py: the target's own top-1 table continuing a drafted tree's deepest leaf. By hand:
where the chain hangs, what it reads, where it stops, when it is left out, how the table learns (every row of a
step, rejected nodes included, nothing else; the prefill seeds it). Through the loop: eagle with a chain stays
greedy-identical on one sequence and a ragged batch, its chain's nodes are kept where the target repeats
itself, and inside auto they are calibrated under a name of their own."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_ragged_batch_greedy_identical, char_tokenizer, hf_greedy, tiny_model
from eagle_helpers import random_drafter
from test_token_recycling import state_of
from specdec import Speculator
from specdec.errors import ConfigError
from specdec.strategies.eagle import Eagle
from specdec.strategies.leaf_chain import LeafChain
from specdec.tree import CandidateTree
from specdec.types import StepResult
from specdec.verifier import Verifier

VOCAB = 16
PROMPT = [5, 9, 3, 5, 9, 3, 5, 9, 3, 5]


def chain_over(table: torch.Tensor, length: int) -> LeafChain:
    chain = LeafChain(length, VOCAB, "cpu", state_of([1, 2]))
    chain.table.copy_(table)
    return chain


# a tree of 5 nodes: depths 0, 0, 1, 1, 2 - node 4 (token 11, under node 2) is its only deepest leaf
TREE = CandidateTree(torch.tensor([3, 9, 4, 6, 11]), (-1, -1, 0, 1, 2))
TABLE = torch.tensor([[(3 * t + 1) % VOCAB] for t in range(VOCAB)])       # [V, 1]: t -> 3t + 1 mod 16


def test_the_chain_hangs_under_the_deepest_leaf_and_reads_the_table():
    chain = chain_over(TABLE, 3)
    tree = chain.extend(TREE, state_of([1, 2]))
    assert tree.parents == TREE.parents + (4, 5, 6)
    expected, token = [], 11
    for _ in range(3):
        token = (3 * token + 1) % VOCAB
        expected.append(token)
    assert tree.tokens.tolist() == TREE.tokens.tolist() + expected == [3, 9, 4, 6, 11, 2, 7, 6]
    assert list(chain.nodes) == [5, 6, 7]


def test_the_first_deepest_leaf_is_the_one_continued():
    tree = CandidateTree(torch.tensor([3, 9, 4, 6]), (-1, -1, 1, 0))     # nodes 2 and 3 both at depth 1
    assert chain_over(TABLE, 1).extend(tree, state_of([1, 2])).parents == tree.parents + (2,)


@pytest.mark.parametrize("max_depth,length", [(6, 3), (4, 1), (3, 0), (2, 0)])
def test_the_chain_stops_where_the_tokens_left_end(max_depth, length):
    """TREE has 3 levels: a chain of 3 fits under a max_depth of 6, one under 4, none under 3."""
    chain = chain_over(TABLE, 3)
    tree = chain.extend(TREE, state_of([1, 2], max_depth=max_depth))
    assert tree.num_nodes == TREE.num_nodes + length and len(chain.nodes) == length
    assert max(tree.depths()) + 1 <= max_depth or length == 0


def test_no_chain_on_sampled_trees_at_a_temperature_or_under_an_empty_tree():
    chain = chain_over(TABLE, 3)
    sampled = CandidateTree(TREE.tokens, TREE.parents, torch.full((5, VOCAB), 1.0 / VOCAB))
    assert chain.extend(sampled, state_of([1, 2])) is sampled
    assert chain.extend(TREE, state_of([1, 2], temperature=0.8)) is TREE
    empty = CandidateTree.empty()
    assert chain.extend(empty, state_of([1, 2])) is empty and not chain.nodes


def test_a_step_overwrites_every_rows_token_with_its_top1_and_no_other_row():
    """The pending token 7 and four nodes (3, 9, 4, 11), two of them rejected: each of the five tokens' rows
    becomes the target's top-1 at its row of the forward; every other row stays."""
    chain = chain_over(TABLE, 2)
    before = chain.table.clone()
    input_ids = torch.tensor([7, 3, 9, 4, 11])
    top_ids = torch.tensor([[1, 2], [4, 5], [7, 8], [10, 11], [13, 14]])
    tree = CandidateTree(torch.tensor([3, 9, 4, 11]), (-1, -1, 0, 1))
    chain.observe(StepResult(tree, (0, 2), 5, 2, None, top_ids, input_ids))
    for row, token in enumerate(input_ids.tolist()):
        assert int(chain.table[token, 0]) == int(top_ids[row, 0])
    untouched = [t for t in range(VOCAB) if t not in input_ids.tolist()]
    assert torch.equal(chain.table[untouched], before[untouched])


def test_the_prefill_seeds_the_table():
    target = tiny_model("llama", seed=1, sharpen=4.0)
    prefilled = Verifier(target).prefill_outputs(PROMPT[:-1], top_k=3)
    chain = LeafChain(2, target.config.vocab_size, "cpu", state_of(PROMPT, prompt_top_ids=prefilled.top_ids))
    logits = target(torch.tensor([PROMPT[:-1]])).logits[0]                       # [P - 1, V]
    last = {token: row for row, token in enumerate(PROMPT[:-1])}                  # a repeated token: its last row
    for token, row in last.items():
        assert int(chain.table[token, 0]) == int(logits[row].argmax())


def test_without_the_prefills_top_ids_the_prompts_text_seeds_the_table():
    """Each prompt token's row holds the token after its last occurrence; the pending token's row (no token after
    it yet) and every other row stay zero."""
    chain = LeafChain(2, VOCAB, "cpu", state_of([4, 7, 4, 9, 12]))
    assert chain.table[:, 0].tolist() == [0, 0, 0, 0, 9, 0, 0, 4, 0, 12] + [0] * 6


def test_the_prefill_computes_no_top_ids_for_eagle_alone_but_does_beside_the_table():
    """top_k_prefill: eagle's chain reads the prompt's text, so the prefill keeps its last row's logits alone;
    auto holding token_recycling too asks the prefill for its table's top ids, and the chain reads them."""
    from specdec.loop import prefill_top_k
    from specdec.strategies.auto import Auto
    from specdec.strategies.prompt_lookup import PromptLookup
    from specdec.strategies.token_recycling import TokenRecycling
    target = tiny_model("llama", seed=1)
    eagle = Eagle(random_drafter(target), table_chain=2)
    assert (eagle.top_k_ids, prefill_top_k(eagle)) == (1, 0)
    assert prefill_top_k(Auto(PromptLookup(), Eagle(random_drafter(target), table_chain=2), profile=False)) == 0
    beside = Auto(PromptLookup(), Eagle(random_drafter(target), table_chain=2), profile=False,
                  more_drafters=[TokenRecycling(profile=False)])
    assert prefill_top_k(beside) == 8


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="length >= 1"):
        LeafChain(0, VOCAB, "cpu", state_of([1, 2]))
    target = tiny_model("llama", seed=1)
    with pytest.raises(ConfigError, match="eagle.table_chain"):
        Eagle(random_drafter(target), table_chain=-1)


# ---------------------------------------------------------------------- through the loop
def test_eagle_with_a_chain_is_greedy_identical_and_asks_top1_only_with_one(arch):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    assert Eagle(random_drafter(target), table_chain=0).top_k_ids == 0      # no chain: no top ids computed
    strategy = Eagle(random_drafter(target), max_nodes=4, depth=3, table_chain=4)
    assert strategy.top_k_ids == 1
    sd = Speculator(target, None, strategy)
    for prompt in (PROMPT, PROMPT[::-1] + PROMPT):
        out = sd.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)


def test_eagle_with_a_chain_is_greedy_identical_in_a_ragged_batch(arch):
    target = tiny_model(arch, seed=1, sharpen=4.0)
    assert_ragged_batch_greedy_identical(Speculator(target, char_tokenizer(),
                                                    Eagle(random_drafter(target), max_nodes=4, table_chain=4)))


def test_the_chain_is_kept_where_the_target_repeats_itself():
    """A target that always says 7: an untrained drafter's tree is mostly wrong, but after a step or two the
    table says 7 after 7, so the chain under the drafted leaf is kept whenever the drafter's own path is: the
    chain adds tokens per forward that the drafter alone does not make."""
    from eagle_helpers import biased_target
    target = biased_target("llama", 5.0, keep_weights=False)
    accepted = {}
    for length in (0, 4):
        out = Speculator(target, None, Eagle(random_drafter(target), max_nodes=4, depth=2, table_chain=length)) \
            .generate(PROMPT, max_new_tokens=40, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, PROMPT, 40, min_new_tokens=40)
        accepted[length] = sum(out.stats.accepted_lengths) / out.stats.target_forwards
    assert accepted[4] > accepted[0] + 1


def test_auto_calibrates_the_chains_nodes_under_their_own_name():
    from specdec.costmodel import CostProfile
    from specdec.strategies.auto import Auto
    from specdec.strategies.prompt_lookup import PromptLookup
    target = tiny_model("llama", seed=2, sharpen=4.0)
    free = CostProfile((0, 64), (1.0, 1.0), 0, "free")
    strategy = Auto(PromptLookup(), Eagle(random_drafter(target), max_nodes=3, depth=2, table_chain=3), costs=free,
                    adapt_costs=False, draft_cost_s=0.0, explore_every=1)
    prompt = [5, 17, 33, 9, 41] * 3
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=24, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)
    names = {key[0].rstrip("+").rstrip("^") for key in strategy.calibrator.tried}   # less rank and mixed marks
    assert "neural~chain" in names and "neural" in names        # the first drafter's slot is named "neural"
