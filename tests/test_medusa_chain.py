"""medusa's table chain (medusa.table_chain, strategies/leaf_chain.py): the heads' tree continued under its deepest
leaf by the target's own top-1 predictions, at no head call. Greedy identity (dynamic and static trees, plain and
token-conditioned heads, one sequence and a ragged batch); the chain's nodes are kept where the target repeats
itself; it is off at a temperature, asks top-1 ids only with a chain, and is refused below 0."""
from __future__ import annotations

import pytest

from conftest import assert_ragged_batch_greedy_identical, char_tokenizer, hf_greedy, tiny_model
from test_medusa import constant_target, fresh_heads, prompt_ids
from specdec.api import Speculator
from specdec.errors import ConfigError
from specdec.strategies.medusa import Medusa


@pytest.mark.parametrize("token_conditioned", [False, True])
@pytest.mark.parametrize("max_nodes", [2, 8])
def test_heads_with_a_chain_are_greedy_identical(arch, token_conditioned, max_nodes):
    model = tiny_model(arch, seed=1, sharpen=4.0)
    strategy = Medusa(fresh_heads(model, noise=0.5, token_conditioned=token_conditioned), max_nodes=max_nodes,
                      top_k=3, table_chain=4)
    assert strategy.top_k_ids == 1
    sd = Speculator(model, None, strategy)
    for seed in (0, 1):
        ids = prompt_ids(seed)
        out = sd.generate(ids, max_new_tokens=20, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, ids, 20, eos_token_id=None)


def test_a_static_tree_with_a_chain_is_greedy_identical():
    model = tiny_model("llama", seed=2, sharpen=4.0)
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    sd = Speculator(model, None, Medusa(fresh_heads(model, noise=0.3), tree="static", choices=choices, table_chain=3))
    ids = prompt_ids(3)
    assert sd.generate(ids, max_new_tokens=24, ignore_eos=True).token_ids == hf_greedy(model, ids, 24, eos_token_id=None)


def test_heads_with_a_chain_are_greedy_identical_in_a_ragged_batch():
    model = tiny_model("llama", seed=1, sharpen=4.0)
    assert_ragged_batch_greedy_identical(Speculator(model, char_tokenizer(),
                                                    Medusa(fresh_heads(model, noise=0.3), max_nodes=2, table_chain=4)))


def test_a_batchs_rows_keep_their_chains():
    """In a batch each row's table learns from its own rows' top-1 (StepResult.top_ids per row): on a target that
    always says 7 the chain under one right head node is kept, as alone."""
    model = constant_target(7)
    prompts = [prompt_ids(0), prompt_ids(1, length=5), prompt_ids(2, length=9)]
    outs = Speculator(model, None, Medusa(fresh_heads(model), max_nodes=1, table_chain=4)).generate(
        prompts, max_new_tokens=[30, 24, 27], ignore_eos=True)
    for prompt, out, n in zip(prompts, outs, [30, 24, 27]):
        assert out.token_ids == hf_greedy(model, prompt, n, min_new_tokens=n)
        assert sum(out.stats.accepted_lengths) / out.stats.target_forwards > 2.5


def test_the_chain_is_kept_where_the_target_repeats_itself():
    """A target that always says 7, and one head node a step (its guess right): the chain under it adds the table's
    7 after 7, tokens a one-node tree cannot make."""
    model = constant_target(7)
    ids = prompt_ids(0)
    per_forward = {}
    for length in (0, 4):
        out = Speculator(model, None, Medusa(fresh_heads(model), max_nodes=1, table_chain=length)) \
            .generate(ids, max_new_tokens=30, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, ids, 30, min_new_tokens=30)
        per_forward[length] = sum(out.stats.accepted_lengths) / out.stats.target_forwards
    assert per_forward[0] <= 1.0 < per_forward[0] + 1.5 < per_forward[4]


@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
def test_no_chain_at_a_temperature_nor_without_asking(sampler):
    model = tiny_model("llama", seed=1, sharpen=4.0)
    assert Medusa(fresh_heads(model), table_chain=0).top_k_ids == 0      # no chain: no top ids computed
    strategy = Medusa(fresh_heads(model, noise=0.3), max_nodes=2, table_chain=4)
    out = Speculator(model, None, strategy).generate(prompt_ids(1), max_new_tokens=16, ignore_eos=True,
                                                     temperature=0.8, seed=0, sampler=sampler)
    assert len(out.token_ids) == 16 and not strategy.chain_nodes
    assert out.stats.proposed_nodes <= 2 * out.stats.target_forwards
    with pytest.raises(ConfigError, match="medusa.table_chain"):
        Medusa(fresh_heads(model), table_chain=-1)


def test_a_temperature_uses_its_own_node_budget():
    """sampled_max_nodes sizes the tree at a temperature (either sampler), max_nodes at greedy."""
    model = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = Medusa(fresh_heads(model, noise=0.3), max_nodes=2, sampled_max_nodes=6, top_k=3, table_chain=0)
    sd = Speculator(model, None, strategy)
    greedy = sd.generate(prompt_ids(1), max_new_tokens=16, ignore_eos=True)
    assert greedy.stats.proposed_nodes <= 2 * greedy.stats.target_forwards
    for sampler in ("rejection", "coupled"):
        sampled = sd.generate(prompt_ids(1), max_new_tokens=16, ignore_eos=True, temperature=0.8, seed=0,
                              sampler=sampler)
        assert 2 * sampled.stats.target_forwards < sampled.stats.proposed_nodes <= 6 * sampled.stats.target_forwards
    with pytest.raises(ConfigError, match="sampled_max_nodes"):
        Medusa(fresh_heads(model), sampled_max_nodes=0)


def test_the_shipped_config_reaches_the_strategy(tmp_path):
    """configs/medusa.yaml's tree settings (the greedy budget, the chain, the budget at a temperature) are the
    loaded strategy's."""
    from omegaconf import OmegaConf
    import specdec
    from specdec.config import find_config_file
    from specdec.heads.io import save_heads
    model = tiny_model("llama", seed=1)
    model.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    save_heads(str(tmp_path / "heads"), fresh_heads(model), model)
    shipped = OmegaConf.load(find_config_file("medusa")).medusa
    strategy = specdec.load("medusa", **{"target.path": str(tmp_path / "target"),
                                         "heads.path": str(tmp_path / "heads"), "device": "cpu"}).strategy
    assert (strategy.max_nodes, strategy.table_chain, strategy.sampled_max_nodes) == \
        (shipped.max_nodes, shipped.table_chain, shipped.sampled_max_nodes) != (8, 0, 8)
