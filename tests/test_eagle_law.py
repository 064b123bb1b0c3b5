"""eagle at temperature > 0 is lossless: exact enumeration of every sibling draw the strategy
makes and every acceptance coin, through the real strategy and the real acceptance rule, gives
the target's own law; a Monte Carlo run of the real loop agrees within a total-variation bound."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import tiny_model
from eagle_helpers import random_drafter, state_for
from law import always_accept, enumerate_law, extend_to_length, sequence_law, total_variation
from specdec.acceptance import accept_sampling
from specdec.api import Speculator
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.strategies.eagle import Eagle
from specdec.tree import WITHOUT_REPLACEMENT
from specdec.verifier import Verifier

VOCAB = 4
PROMPT = [3, 1, 2, 1, 0, 2]


def small_target(seed: int = 0):
    return tiny_model("llama", seed=seed, vocab=VOCAB, sharpen=2.0)


def target_dist(model, temperature: float):
    """context (tokens after PROMPT) -> the target's warped next-token distribution [V], float64."""
    cache = {}
    params = SamplingParams(temperature)

    def dist(context: tuple) -> torch.Tensor:
        if context not in cache:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([PROMPT + list(context)])).logits[0, -1]
            cache[context] = logits_to_probs(logits, params).double()
        return cache[context]
    return dist


# EAGLE-3 with a reduced vocabulary: draft tokens 1 and 3 of 4 (zero draft mass on 0 and 2)
DRAFTERS = {"eagle1": lambda model: random_drafter(model, seed=1),
            "eagle3-reduced": lambda model: random_drafter(model, (1, 2, 2), seed=1, draft_vocab=[1, 3])}


WHOLE_TREE = dict(sampled_top_k=None, sampled_depth=None)    # sampled trees as wide and deep as top_k / depth


def prepared_strategy(model, drafter, temperature, dtype=None, **tree):
    strategy = Eagle(drafter, **WHOLE_TREE, dtype=dtype, **tree)
    strategy.bind(model, None)
    hidden = Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers)
    state = state_for(PROMPT, hidden, temperature=temperature)
    strategy.reset(state)
    return strategy, state


@pytest.mark.parametrize("temperature,tree,dtype,drafter", [
    (1.0, dict(max_nodes=3, top_k=2, depth=2), None, "eagle1"),
    (1.0, dict(max_nodes=3, top_k=2, depth=2), "bfloat16", "eagle1"),    # a bf16 drafter beside a float32 target
    (1.0, dict(max_nodes=3, top_k=2, depth=2), None, "eagle3-reduced"),
    pytest.param(0.7, dict(max_nodes=4, top_k=2, depth=3), None, "eagle1", marks=pytest.mark.slow),
])
def test_exact_law_of_eagle_trees_through_the_acceptance_rule(temperature, tree, dtype, drafter):
    model = small_target()
    strategy, state = prepared_strategy(model, DRAFTERS[drafter](model), temperature, dtype, **tree)
    assert next(strategy.drafter.parameters()).dtype == (torch.bfloat16 if dtype else model.dtype)
    dist = target_dist(model, temperature)
    context = tuple(PROMPT[1:])          # the last committed token (pending) is PROMPT[-1]
    seen_trees = set()
    # the whole tree depends on the strategy's sibling draws: enumerate them as well
    prefix_of_pending = ()

    def one_step(rng):
        state.rng = rng                   # the strategy's draws go through the call's one random source
        candidate = strategy.propose(state)
        assert candidate.siblings == WITHOUT_REPLACEMENT and candidate.draft_probs is not None
        tokens = candidate.tokens.tolist()
        seen_trees.add((tuple(tokens), candidate.parents))
        rows = [dist(prefix_of_pending)]
        for node in range(candidate.num_nodes):
            path, i = [], node
            while i >= 0:
                path.append(tokens[i])
                i = candidate.parents[i]
            rows.append(dist(tuple(reversed(path))))
        verdict = accept_sampling(candidate, torch.stack(rows).float(), rng)
        return tuple(tokens[n] for n in verdict.accepted) + (verdict.next_token,)

    law = enumerate_law(one_step)
    length = tree["depth"] + 1
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    assert total_variation(extend_to_length(law, dist, length), sequence_law(dist, length)) < 1e-6
    # the draws really vary the tree (two draft tokens make fewer trees)
    assert len(seen_trees) > (10 if drafter == "eagle1" else 2)
    assert max(len(t[0]) for t in seen_trees) == tree["max_nodes"]
    del context


def test_sampled_tree_reports_the_distributions_it_drew_from():
    model = small_target()
    strategy, state = prepared_strategy(model, random_drafter(model, seed=1), 0.9, max_nodes=6, top_k=2, depth=3)
    tree = strategy.propose(state)
    root_q = logits_to_probs(strategy.root[1], SamplingParams(0.9))
    for node in tree.children(-1):
        torch.testing.assert_close(tree.draft_probs[node], root_q)
    assert tree.num_nodes == 6 and max(tree.depths()) == 2
    # siblings are distinct (drawn without replacement)
    for node in range(-1, tree.num_nodes):
        kids = [tree.tokens[c].item() for c in tree.children(node)]
        assert len(kids) == len(set(kids))


def _first_tokens_law(speculator, runs: int, tokens: int, keep: int, temperature: float) -> dict:
    counts = Counter(tuple(speculator.generate(PROMPT, max_new_tokens=tokens, temperature=temperature, seed=seed,
                                               ignore_eos=True).token_ids[:keep]) for seed in range(runs))
    return {k: v / runs for k, v in counts.items()}


@pytest.mark.slow
def test_monte_carlo_through_the_real_loop_matches_the_target(monkeypatch):
    """3 new tokens (trees 2 levels deep), the law of the first 2 compared with the target's;
    negative control: a verifier that always accepts the first child fails the same bound."""
    model = small_target(seed=2)
    temperature, runs, bound = 1.0, 800, 0.12
    speculator = Speculator(model, None, Eagle(random_drafter(model, seed=3), max_nodes=4, top_k=2, depth=3, **WHOLE_TREE))
    exact = sequence_law(target_dist(model, temperature), 2)
    # sampling noise of 800 draws over 16 outcomes: E[TV] ~ 0.4 * sum(sqrt(p)) / sqrt(800) < 0.06
    tv = total_variation(_first_tokens_law(speculator, runs, 3, 2, temperature), exact)
    assert tv < bound, tv
    import specdec.loop
    monkeypatch.setattr(specdec.loop, "accept_sampling", lambda tree, probs, rng, tables=None: always_accept(tree, probs, rng))
    wrong = total_variation(_first_tokens_law(speculator, runs, 3, 2, temperature), exact)
    assert wrong > bound, wrong


# ---------------------------------------------------------------------- the real loop and verifier
@pytest.mark.parametrize("params,drafter", [
    (SamplingParams(0.8, top_k=3), "eagle1"), (SamplingParams(0.8, top_k=3), "eagle3-reduced"),
    pytest.param(SamplingParams(1.0), "eagle1", marks=pytest.mark.slow)], ids=["t0.8-top3", "t0.8-top3-eagle3", "t1"])
def test_exact_law_through_the_loop_and_verifier(params, drafter):
    """Speculator.generate with eagle, every draw enumerated (tests/law.py): the target rows come
    from the verifier's tree forward, the features the drafter reads from the prefill and the
    verify steps, and trees of a second step follow the first step's verdict."""
    from law import generation_law, laws_close, model_dist, token_law
    model = small_target()
    speculator = Speculator(model, None, Eagle(DRAFTERS[drafter](model), max_nodes=3, top_k=2, depth=2,
                                               **WHOLE_TREE))
    law = generation_law(speculator, PROMPT, 3, params)
    tokens, expected = token_law(law), sequence_law(model_dist(model, PROMPT, params), 3)
    assert abs(sum(tokens.values()) - 1) < 1e-6
    assert laws_close(tokens, expected), f"TV {total_variation(tokens, expected):.2e}"
    steps = {accepted for (_, accepted) in law}
    assert any(a[0] > 0 for a in steps) and any(len(a) > 1 for a in steps), "kept drafts, and second steps"
