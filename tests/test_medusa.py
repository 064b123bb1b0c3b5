"""The medusa strategy: greedy identity with untrained heads on several architectures, tree
building (dynamic = best paths by cumulative head probability, static = rank choices)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from conftest import hf_greedy, tiny_model
from specdec.api import Speculator
from specdec.errors import ConfigError
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.heads.io import output_vocab
from specdec.sampling import SamplingParams, TorchRandom
from specdec.strategies.medusa import ConditionedExpander, Medusa, best_first_nodes, best_plain_nodes, static_nodes
from specdec.types import DecodeState


def fresh_heads(model, num_heads: int = 3, num_layers: int = 1, noise: float = 0.0, seed: int = 0,
                token_conditioned: bool = False, own_lm_head: bool = False) -> MedusaHeads:
    """Untrained heads for `model`; noise > 0 makes the blocks differ from the identity."""
    layout = HeadsLayout(num_heads, num_layers, model.config.hidden_size, output_vocab(model),
                         token_conditioned=token_conditioned, own_lm_head=own_lm_head)
    heads = MedusaHeads(layout)
    if noise:
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in heads.parameters():
                p.add_(noise * torch.randn_like(p))
    return heads


def prompt_ids(seed: int, length: int = 12, vocab: int = 96) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist()


@pytest.mark.parametrize("noise,token_conditioned", [(0.0, False), (0.5, False), (0.5, True)])
def test_greedy_identity_untrained_heads(arch, noise, token_conditioned):
    model = tiny_model(arch, seed=1, sharpen=4.0)
    heads = fresh_heads(model, noise=noise, token_conditioned=token_conditioned)
    sd = Speculator(model, None, Medusa(heads, max_nodes=8, top_k=3))
    for seed in (0, 1):
        ids = prompt_ids(seed)
        out = sd.generate(ids, max_new_tokens=20, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, ids, 20, eos_token_id=None)
        assert_step_accounting(out, 20)


def test_greedy_identity_static_tree():
    model = tiny_model("llama", seed=2, sharpen=4.0)
    choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    sd = Speculator(model, None, Medusa(fresh_heads(model, noise=0.3), tree="static", choices=choices))
    ids = prompt_ids(3)
    out = sd.generate(ids, max_new_tokens=24, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, ids, 24, eos_token_id=None)
    assert_step_accounting(out, 24)


def constant_target(token: int = 7):
    """A target that always says `token` (zero lm_head weights, a bias for it): untrained heads on
    its lm_head say it too, at every depth; their lower ranks are always wrong."""
    model = tiny_model("llama", seed=0)
    lm_head = torch.nn.Linear(32, 96, bias=True)
    with torch.no_grad():
        lm_head.weight.zero_()
        lm_head.bias.zero_()
        lm_head.bias[token] = 5.0
    model.set_output_embeddings(lm_head)
    return model


def test_right_guesses_are_accepted():
    """Every drafted token is accepted: K + 1 = 4 tokens per forward."""
    model = constant_target(7)
    sd = Speculator(model, None, Medusa(fresh_heads(model, num_heads=3), max_nodes=6, top_k=2))
    ids = prompt_ids(5)
    out = sd.generate(ids, max_new_tokens=33, ignore_eos=True)
    assert out.token_ids == [7] * 33 == hf_greedy(model, ids, 33, eos_token_id=None)
    assert out.stats.accepted_lengths == [3] * 8 + [0]           # 8 x (3 + 1) tokens, then the 33rd alone
    assert out.stats.target_forwards == 1 + 32 // 4 and out.stats.tokens_per_forward > 3


def test_partial_acceptance_keeps_the_right_prefix():
    """Static tree [[0], [0, 1]]: head 1's best guess (right) then head 2's second best (wrong):
    every step accepts the first level and rejects the second, 2 tokens per forward."""
    model = constant_target(7)
    sd = Speculator(model, None, Medusa(fresh_heads(model, num_heads=2), tree="static", choices=[[0], [0, 1]]))
    ids = prompt_ids(6)
    out = sd.generate(ids, max_new_tokens=21, ignore_eos=True)
    assert out.token_ids == [7] * 21 == hf_greedy(model, ids, 21, eos_token_id=None)
    accepted = out.stats.accepted_lengths
    assert all(0 < a < 2 for a in accepted[:-1]), accepted   # partial: 0 < accepted < tree depth
    assert accepted[-1] == 0                                  # the last token fits no tree (budget 1)
    assert_step_accounting(out, 21)
    assert out.stats.tokens_per_forward == pytest.approx(21 / 11)


def assert_step_accounting(out, max_new_tokens: int):
    """One target forward per step, each step committing its accepted tokens + 1: the forwards
    are exactly the steps the accepted lengths imply."""
    accepted = out.stats.accepted_lengths
    assert len(out.token_ids) == max_new_tokens == sum(a + 1 for a in accepted)
    assert out.stats.target_forwards == len(accepted) == max_new_tokens - sum(accepted)


def _propose(medusa, hidden, max_depth=16):
    """What medusa proposes right after a prefill whose last row's hidden state is `hidden` [H]
    (None: a one-token prompt, no prefill row)."""
    state = DecodeState(token_ids=[5, 6], prompt_len=2, sampling=SamplingParams(), rng=TorchRandom(torch.Generator()),
                        max_depth=max_depth, prompt_hidden=None if hidden is None else hidden[None])
    medusa.reset(state)
    return medusa.propose(state)


def test_one_token_prompt_proposes_nothing_then_a_tree_within_budget():
    model = tiny_model("gpt2", seed=0)
    medusa = Medusa(fresh_heads(model, num_heads=3, noise=0.5), max_nodes=10, top_k=3)
    medusa.bind(model, None)
    assert _propose(medusa, None).num_nodes == 0
    tree = _propose(medusa, torch.randn(32))
    assert 1 <= tree.num_nodes <= 10
    assert max(tree.depths()) < 3
    shallow = _propose(medusa, torch.randn(32), max_depth=1)
    assert max(shallow.depths()) == 0


def test_dynamic_tree_root_child_is_head_one_argmax():
    model = tiny_model("llama", seed=0)
    heads = fresh_heads(model, num_heads=2, noise=0.5)
    medusa = Medusa(heads, max_nodes=6, top_k=3)
    medusa.bind(model, None)
    hidden = torch.randn(32)
    tree = _propose(medusa, hidden)
    with torch.no_grad():
        logits = heads(hidden)                                                  # [K, V]
    assert tree.tokens[0].item() == logits[0].argmax().item()
    for node in tree.children(0):   # children of the first node come from head 2's top guesses
        assert tree.tokens[node].item() in logits[1].topk(3).indices.tolist()


@pytest.mark.parametrize("depth,width,budget", [(3, 3, 7), (2, 4, 5), (4, 2, 11), (1, 5, 3)])
def test_plain_heads_tree_matches_brute_force(depth, width, budget):
    """Plain heads: the chosen nodes are the budget best rank paths by cumulative log-probability."""
    torch.manual_seed(depth * 10 + width)
    head_logits = torch.randn(depth, 20)                                                   # [D, V]
    tree = best_plain_nodes(head_logits, width, budget, "cpu")
    top = head_logits.log_softmax(-1).topk(width)                                          # [D, k]
    all_paths = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    score = {tuple(top.indices[i, r].item() for i, r in enumerate(p)): sum(top.values[i, r].item() for i, r in enumerate(p))
             for p in all_paths}                                                          # token path -> score
    expected = sorted(score.values(), reverse=True)[:budget]
    chosen = _paths_of(tree)
    assert tree.num_nodes == len(set(chosen)) == min(budget, len(all_paths))
    assert sorted((score[p] for p in chosen), reverse=True) == pytest.approx(expected)


def test_bad_tree_settings_are_config_errors():
    model = tiny_model("llama", seed=0)
    heads = fresh_heads(model, num_heads=2)
    with pytest.raises(ConfigError, match="dynamic"):
        Medusa(heads, tree="wide")
    with pytest.raises(ConfigError, match="choices"):
        Medusa(heads, tree="static")
    with pytest.raises(ConfigError, match="1..2"):
        Medusa(heads, tree="static", choices=[[0, 0, 0]])


def test_sampling_runs_are_seeded():
    model = tiny_model("qwen2", seed=0, sharpen=2.0)
    sd = Speculator(model, None, Medusa(fresh_heads(model, noise=0.5), max_nodes=6))
    ids = prompt_ids(7)
    a = sd.generate(ids, max_new_tokens=16, temperature=0.8, seed=3, ignore_eos=True).token_ids
    b = sd.generate(ids, max_new_tokens=16, temperature=0.8, seed=3, ignore_eos=True).token_ids
    assert a == b and len(a) == 16
    assert not math.isnan(sum(a))


# ---------------------------------------------------------------------- token-conditioned heads
def _conditioned(model, num_heads=3):
    from specdec.heads.io import bind_heads
    return bind_heads(fresh_heads(model, num_heads=num_heads, noise=0.5, token_conditioned=True), model)


def _all_node_paths(expander, pending, depth_limit):
    """Brute force: every path of top-k children down to depth_limit, with its cumulative log-prob."""
    out, frontier = {}, [((), pending, 0.0)]
    for depth in range(depth_limit):
        nxt = []
        for path, token, score in frontier:
            (logprobs,), children = expander.children(depth, [token])
            for logprob, child in zip(logprobs, children[0].tolist()):
                out[path + (child,)] = score + logprob
                nxt.append((path + (child,), child, score + logprob))
        frontier = nxt
    return out


def _paths_of(tree):
    tokens, paths = tree.tokens.tolist(), []
    for i in range(tree.num_nodes):
        path, node = [], i
        while node != -1:
            path.append(tokens[node])
            node = tree.parents[node]
        paths.append(tuple(reversed(path)))
    return paths


@pytest.mark.parametrize("max_nodes", [1, 5, 12])
def test_conditioned_best_first_picks_the_best_nodes(max_nodes):
    """Each child comes from the next head run on its parent's own token; the chosen nodes are the
    max_nodes best by cumulative log-probability among all top-k paths (checked by brute force)."""
    model = tiny_model("llama", seed=4)
    expander = ConditionedExpander(_conditioned(model), torch.randn(model.config.hidden_size), top_k=3)
    tree = best_first_nodes(expander, pending=9, depth_limit=3, max_nodes=max_nodes)
    scores = _all_node_paths(expander, 9, 3)
    chosen = _paths_of(tree)
    assert tree.num_nodes == max_nodes == len(set(chosen))
    cutoff = sorted(scores.values(), reverse=True)[max_nodes - 1]
    assert all(scores[p] >= cutoff - 1e-6 for p in chosen)


def test_conditioned_static_tree_follows_rank_choices():
    model = tiny_model("llama", seed=5)
    expander = ConditionedExpander(_conditioned(model), torch.randn(model.config.hidden_size), top_k=2)
    choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    tree = static_nodes(expander, 9, choices)
    paths = dict(zip(map(tuple, sorted(choices, key=lambda c: (len(c), c))), _paths_of(tree)))
    for ranks, tokens in paths.items():
        parent_token = tokens[-2] if len(tokens) > 1 else 9
        _, children = expander.children(len(ranks) - 1, [parent_token])
        assert tokens[-1] == children[0, ranks[-1]].item()
        if len(ranks) > 1:
            assert paths[ranks[:-1]] == tokens[:-1]
    lone = static_nodes(expander, 9, [[0, 1]])            # a path without its prefix gets the prefix too
    assert lone.parents == (-1, 0) and _paths_of(lone)[0] == paths[(0,)][:1]


@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_greedy_identity_conditioned_heads(arch, tree):
    model = tiny_model(arch, seed=1, sharpen=4.0)
    choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]] if tree == "static" else None
    medusa = Medusa(fresh_heads(model, noise=0.5, token_conditioned=True), tree=tree, choices=choices,
                    max_nodes=8, top_k=3)
    sd = Speculator(model, None, medusa)
    for seed in (0, 1):
        ids = prompt_ids(seed)
        out = sd.generate(ids, max_new_tokens=20, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, ids, 20, eos_token_id=None)
        assert_step_accounting(out, 20)


# ---------------------------------------------------------------------- stacked projections, sampling
@pytest.mark.parametrize("own_lm_head", [False, True])
def test_stacked_vocabulary_projection_equals_the_per_head_path(own_lm_head):
    """forward() projects all K heads' features in one matmul; each row equals head_logits(k)."""
    from specdec.heads.io import bind_heads
    model = tiny_model("llama", seed=3)
    layout = HeadsLayout(3, 1, model.config.hidden_size, output_vocab(model), own_lm_head=own_lm_head)
    heads = MedusaHeads(layout)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.5 * torch.randn_like(p))
    bind_heads(heads, model)
    hidden = torch.randn(5, model.config.hidden_size)
    with torch.no_grad():
        stacked = heads(hidden)                                                        # [5, K, V]
        for k in range(1, 4):
            torch.testing.assert_close(stacked[:, k - 1], heads.head_logits(k, hidden), rtol=1e-6, atol=1e-6)
        if own_lm_head:            # the kept stack follows an in-place weight change
            heads.lm_heads[1].weight.mul_(2)
            torch.testing.assert_close(heads(hidden)[:, 1], heads.head_logits(2, hidden), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("token_conditioned", [False, True])
def test_sampled_tree_carries_the_heads_real_distributions(token_conditioned):
    """T > 0, rejection sampler: the root's children are drawn without replacement from head 1's
    warped distribution, and draft_probs rows are that distribution."""
    from specdec.sampling import SamplingParams, logits_to_probs
    from specdec.tree import WITHOUT_REPLACEMENT
    model = tiny_model("llama", seed=1, sharpen=4.0)
    medusa = Medusa(fresh_heads(model, noise=0.5, token_conditioned=token_conditioned), max_nodes=6, top_k=3)
    medusa.bind(model, None)
    medusa.last_hidden = torch.randn(model.config.hidden_size)
    params = SamplingParams(0.8)
    state = DecodeState(token_ids=[5, 6, 9], prompt_len=3, sampling=params,
                        rng=TorchRandom(torch.Generator().manual_seed(0)), max_depth=8)
    tree = medusa.propose(state)
    assert tree.siblings == WITHOUT_REPLACEMENT and tree.num_nodes == 6
    with torch.no_grad():
        ids = torch.tensor([9]) if token_conditioned else None
        head1 = medusa.heads(medusa.last_hidden[None], ids, head=1)[0] if token_conditioned \
            else medusa.heads(medusa.last_hidden)[0]
    root_q = logits_to_probs(head1.float(), params)
    kids = tree.children(-1)
    assert kids and len({tree.tokens[c].item() for c in kids}) == len(kids)
    for node in kids:
        torch.testing.assert_close(tree.draft_probs[node], root_q)
