"""The core promise: whatever the tree, the verifier's output law is the target's.

Exact: on a 4-token vocabulary, enumerate every draft draw and every accept/reject outcome
(tests/law.py), complete the emitted tokens to a fixed length with the target, and compare with
the target's own law of that many tokens. Monte Carlo: a 50-token vocabulary, real torch
generators, total-variation bound. Negative control: an always-accept verifier fails both.
"""
from __future__ import annotations

import pytest
import torch

from law import always_accept, enumerate_law, extend_to_length, random_table, sequence_law, total_variation
from specdec.acceptance import Verdict, accept_greedy, accept_sampling
from specdec.sampling import SamplingParams, TorchRandom, logits_to_probs
from specdec.tree import INDEPENDENT, WITHOUT_REPLACEMENT, CandidateTree

V = 4
LENGTH = 3  # emitted sequences are completed / cut to this many tokens


def warped(table, params: SamplingParams):
    """The table's distributions after temperature / top-k / top-p (as the loop applies them)."""
    if params == SamplingParams(1.0):
        return table

    def dist(ctx):
        return logits_to_probs(table(ctx).log(), params).double()
    return dist


# ----------------------------------------------------------------------------- tree samplers
# Each sampler draws a tree with `rng` (so enumeration covers the draft's randomness too) and
# returns (tree, contexts): contexts[i] is the token path from the pending token to node i.

def stochastic_chain(draft, rng, depth=2):
    tokens, rows, ctx = [], [], ()
    contexts = []
    for _ in range(depth):
        q = draft(ctx)
        x = rng.categorical(q)
        tokens.append(x)
        rows.append(q)
        ctx = ctx + (x,)
        contexts.append(ctx)
    return CandidateTree.chain(tokens, torch.stack(rows).float()), contexts


def early_stopping_chain(draft, rng, depth=3, min_confidence=0.3):
    """A chain that stops where the draft gave its own token less than min_confidence (the
    draft_model strategy's early stop): its length depends on the draws."""
    tokens, rows, ctx, contexts = [], [], (), []
    for _ in range(depth):
        q = draft(ctx)
        x = rng.categorical(q)
        tokens.append(x)
        rows.append(q)
        ctx = ctx + (x,)
        contexts.append(ctx)
        if q[x] < min_confidence:
            break
    return CandidateTree.chain(tokens, torch.stack(rows).float()), contexts


def stochastic_tree(draft, rng, siblings: str, widths=(2, 1)):
    """widths[d] children per node at depth d, drawn from the draft (independently or without
    replacement)."""
    tokens, parents, rows, contexts = [], [], [], []
    level = [(-1, ())]
    for width in widths:
        next_level = []
        for parent, ctx in level:
            q = draft(ctx)
            if siblings == WITHOUT_REPLACEMENT:
                drawn = rng.sample_without_replacement(q, width)
            else:
                drawn = [rng.categorical(q) for _ in range(width)]
            for x in drawn:
                tokens.append(x)
                parents.append(parent)
                rows.append(q)
                contexts.append(ctx + (x,))
                next_level.append((len(tokens) - 1, ctx + (x,)))
        level = next_level
    tree = CandidateTree(torch.tensor(tokens), tuple(parents), torch.stack(rows).float(), siblings)
    return tree, contexts


def point_mass_tree(paths):
    tree = CandidateTree.from_paths(paths)
    tokens = tree.tokens.tolist()
    contexts = []
    for i, p in enumerate(tree.parents):
        contexts.append((contexts[p] if p >= 0 else ()) + (tokens[i],))
    return lambda draft, rng: (tree, contexts)


def emission_law(target, draft, sampler, verify=accept_sampling):
    def one_step(rng):
        tree, contexts = sampler(draft, rng)
        target_probs = torch.stack([target(())] + [target(c) for c in contexts]).float()   # [1 + N, V]
        verdict = verify(tree, target_probs, rng)
        tokens = tree.tokens.tolist()
        return tuple(tokens[n] for n in verdict.accepted) + (verdict.next_token,)
    return enumerate_law(one_step)


SAMPLERS = {
    "chain": lambda d, rng: stochastic_chain(d, rng, depth=2),
    "chain-early-stop": early_stopping_chain,
    "tree-independent": lambda d, rng: stochastic_tree(d, rng, INDEPENDENT, (2, 1)),
    "tree-without-replacement": lambda d, rng: stochastic_tree(d, rng, WITHOUT_REPLACEMENT, (2, 1)),
    "tree-without-replacement-3": lambda d, rng: stochastic_tree(d, rng, WITHOUT_REPLACEMENT, (3,)),
    "point-mass-chain": point_mass_tree([[1, 3]]),
    "point-mass-trie": point_mass_tree([[0, 1], [2, 1], [2, 3], [3]]),
}
WARPS = {
    "plain": SamplingParams(1.0),
    "temperature": SamplingParams(0.7),
    "top-k": SamplingParams(1.0, top_k=2),
    "top-p": SamplingParams(0.9, top_p=0.7),
}


@pytest.mark.parametrize("seeds", [(5, 6), (7, 8)])
@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("shape", SAMPLERS)
def test_exact_law_equals_target(shape, warp, seeds):
    target = warped(random_table(V, seed=seeds[0]), WARPS[warp])
    draft = warped(random_table(V, seed=seeds[1]), WARPS[warp])
    law = emission_law(target, draft, SAMPLERS[shape])
    assert abs(sum(law.values()) - 1) < 1e-6
    tv = total_variation(extend_to_length(law, target, LENGTH), sequence_law(target, LENGTH))
    assert tv < 1e-5, f"{shape}/{warp}: output law differs from the target's (TV {tv:.2e})"


@pytest.mark.parametrize("shape", ["chain", "tree-without-replacement", "point-mass-trie"])
def test_exact_law_negative_control(shape):
    target, draft = random_table(V, seed=5), random_table(V, seed=6)
    law = emission_law(target, draft, SAMPLERS[shape], verify=always_accept)
    tv = total_variation(extend_to_length(law, target, LENGTH), sequence_law(target, LENGTH))
    assert tv > 0.05, "the law test must be able to catch a verifier that accepts everything"


def test_draft_equal_to_target_accepts_everything_without_nan():
    target = random_table(V, seed=3)
    law = emission_law(target, target, SAMPLERS["chain"])
    assert all(len(seq) == 3 for seq in law)          # both drafted tokens kept, plus the bonus
    probs = torch.tensor([0.5, 0.5, 0.0, 0.0])
    tree = CandidateTree.chain([0], probs[None].clone())
    verdict = accept_sampling(tree, torch.stack([probs, probs]), TorchRandom(torch.Generator().manual_seed(0)))
    assert verdict.accepted == (0,) and verdict.next_token in (0, 1)


def test_greedy_walks_to_the_argmax_child():
    tree = CandidateTree.from_paths([[5, 6, 7], [5, 8], [9]])   # nodes: 5 6 7 8 9
    #               rows: pending, 5,  6,  7,  8,  9
    verdict = accept_greedy(tree, [5, 8, 0, 0, 3, 0])
    assert verdict.accepted == (0, 3) and verdict.next_token == 3
    verdict = accept_greedy(tree, [4, 8, 0, 0, 3, 0])
    assert verdict.accepted == () and verdict.next_token == 4


# ----------------------------------------------------------------------------- Monte Carlo
def _monte_carlo(verify, trials=6000, vocab=50, gamma=3, seed=0):
    """Empirical law of the first two emitted tokens' marginals, drafts drawn by torch."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(gamma + 1, vocab, generator=gen) * 2     # position-wise target
    draft_logits = torch.randn(gamma, vocab, generator=gen) * 2
    params = SamplingParams(0.9, top_p=0.95)
    target_probs = logits_to_probs(target_logits, params)                # [gamma + 1, V]
    draft_probs = logits_to_probs(draft_logits, params)                  # [gamma, V]
    rng = TorchRandom(gen)
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)
    for _ in range(trials):
        tokens = torch.multinomial(draft_probs, 1, generator=gen)[:, 0]  # [gamma]
        verdict = verify(CandidateTree.chain(tokens, draft_probs), target_probs, rng)
        emitted = tokens[list(verdict.accepted)].tolist() + [verdict.next_token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
        else:
            second[int(torch.multinomial(target_probs[1], 1, generator=gen))] += 1
    # the target here ignores context: position d has distribution target_probs[d]
    tv_first = 0.5 * (first / trials - target_probs[0]).abs().sum().item()
    tv_second = 0.5 * (second / trials - target_probs[1]).abs().sum().item()
    return tv_first, tv_second


def test_monte_carlo_total_variation():
    tv_first, tv_second = _monte_carlo(accept_sampling)
    assert tv_first < 0.06 and tv_second < 0.06, (tv_first, tv_second)


def test_monte_carlo_negative_control():
    tv_first, tv_second = _monte_carlo(always_accept)
    assert max(tv_first, tv_second) > 0.15, (tv_first, tv_second)


# ----------------------------------------------------------------------------- the old walks
# The walks as they were before acceptance read the device once (greedy) or twice (sampling, with
# batched tables), kept as references: the verdicts (greedy) and the exact joint laws of (accepted
# path, next token) (sampling) must be the same.
def reference_greedy(tree, target_tokens: list[int]):
    tokens = tree.tokens.tolist()
    accepted, node = [], -1
    while True:
        want = target_tokens[node + 1]
        for child in tree.children(node):
            if tokens[child] == want:
                accepted.append(child)
                node = child
                break
        else:
            return tuple(accepted), want


def reference_sampling(tree, target_probs, rng):
    tokens = tree.tokens.tolist()
    without_replacement = tree.siblings == WITHOUT_REPLACEMENT
    accepted, node = [], -1
    while True:
        kids = tree.children(node)
        residual = target_probs[node + 1]
        if not kids:
            return tuple(accepted), rng.categorical(residual)
        tried = []
        for child in kids:
            token = tokens[child]
            if tree.draft_probs is None:
                accept_prob = residual[token]
            else:
                draft = tree.draft_probs[child]
                if without_replacement and tried:
                    draft = draft.clone()
                    draft[tried] = 0
                    draft = draft / draft.sum()
                accept_prob = torch.clamp(residual[token] / draft[token], max=1.0)
            if rng.bernoulli(accept_prob):
                accepted.append(child)
                node = child
                break
            if tree.draft_probs is None:
                rejected = residual.clone()
                rejected[token] = 0
            else:
                rejected = torch.clamp(residual - draft, min=0)
            if rejected.sum() > 0:
                residual = rejected / rejected.sum()
            tried.append(token)
        else:
            return tuple(accepted), rng.categorical(residual)


def random_tree(gen, num_nodes: int, vocab: int, shape: str, draft: str = "none", siblings: str = INDEPENDENT):
    """shape: chain | tree (random parents); draft: none (point masses, duplicate siblings
    possible) or probs (random draft rows with some zeros, tokens drawn from them: independently,
    or siblings from one shared row without replacement)."""
    parents = [i - 1 if shape == "chain" else int(torch.randint(-1, i, (), generator=gen)) for i in range(num_nodes)]
    rows = torch.softmax(2 * torch.randn(num_nodes, vocab, generator=gen), -1)
    rows[torch.rand(num_nodes, vocab, generator=gen) < 0.2] = 0            # zeros: exercise the guards
    rows[:, 0] += 1e-3
    rows = rows / rows.sum(-1, keepdim=True)                               # [N, V]
    tokens, first_sibling, drawn = [], {}, {}
    for i, p in enumerate(parents):
        if siblings == WITHOUT_REPLACEMENT:
            rows[i] = rows[first_sibling.setdefault(p, i)]
        left = rows[i].clone()
        if siblings == WITHOUT_REPLACEMENT:
            left[drawn.get(p, [])] = 0
            if left.sum() == 0:                                            # no token left for this sibling
                return random_tree(gen, num_nodes, vocab, shape, draft, siblings)
        tokens.append(int(torch.multinomial(left, 1, generator=gen)))
        drawn.setdefault(p, []).append(tokens[-1])
    return CandidateTree(torch.tensor(tokens, dtype=torch.long), tuple(parents),
                         rows.float() if draft == "probs" else None, siblings)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_verdict_equals_the_walk(shape):
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        num_nodes = int(torch.randint(0, 12, (), generator=gen))
        tree = random_tree(gen, num_nodes, vocab=3, shape=shape)                   # tiny vocab: many matches
        target_tokens = torch.randint(0, 3, (1 + num_nodes,), generator=gen)
        expected = reference_greedy(tree, target_tokens.tolist())
        verdict = accept_greedy(tree, target_tokens)
        assert (verdict.accepted, verdict.next_token) == expected, (tree.parents, tree.tokens.tolist(), target_tokens)
        assert verdict.accepted_tokens == tuple(tree.tokens[list(verdict.accepted)].tolist())


def test_greedy_keeps_the_first_matching_sibling():
    tree = CandidateTree(torch.tensor([4, 7, 7, 5, 6]), (-1, -1, -1, 1, 2))   # two siblings with token 7
    verdict = accept_greedy(tree, [7, 0, 0, 9, 9, 0])
    assert verdict.accepted == (1,) and verdict.next_token == 0              # the first 7, not its twin
    verdict = accept_greedy(tree, [7, 0, 5, 6, 0, 0])
    assert verdict.accepted == (1, 3) and verdict.next_token == 0 and verdict.accepted_tokens == (7, 5)
    assert accept_greedy(CandidateTree.empty(), [3]) == Verdict((), 3, ())


@pytest.mark.parametrize("draft,siblings", [("none", INDEPENDENT), ("probs", INDEPENDENT),
                                            ("probs", WITHOUT_REPLACEMENT)])
def test_batched_rejection_sampling_has_the_walks_law(draft, siblings):
    """Same joint law of (accepted path, next token) as the host walk, on random trees with
    duplicate siblings (independent), zero-probability tokens and zero residuals."""
    gen = torch.Generator().manual_seed(1)
    vocab = 4
    for trial in range(25):
        num_nodes = int(torch.randint(0, 7, (), generator=gen))
        tree = random_tree(gen, num_nodes, vocab, "tree" if trial % 3 else "chain", draft, siblings)
        target_probs = torch.softmax(2 * torch.randn(1 + num_nodes, vocab, generator=gen), -1)
        target_probs[torch.rand(1 + num_nodes, vocab, generator=gen) < 0.2] = 0
        target_probs[:, 1] += 1e-3
        target_probs = target_probs / target_probs.sum(-1, keepdim=True)

        def new(rng):
            verdict = accept_sampling(tree, target_probs, rng)
            return verdict.accepted, verdict.next_token
        expected = enumerate_law(lambda rng: reference_sampling(tree, target_probs, rng))
        law = enumerate_law(new)
        assert total_variation(law, expected) < 1e-6, (tree.parents, tree.tokens.tolist())
    if draft == "probs":
        tree = CandidateTree.chain([0], torch.tensor([[0.5, 0.5, 0.0, 0.0]]))
        assert total_variation(enumerate_law(lambda rng: (accept_sampling(tree, tree.draft_probs.repeat(2, 1), rng).next_token,)),
                               {(0,): 0.5, (1,): 0.5}) < 1e-6


def test_torch_random_uniforms_decide_like_a_fresh_draw():
    """A TorchRandom step draws its uniforms in one call; the verdict is reproducible for a seed."""
    gen = torch.Generator().manual_seed(2)
    tree = random_tree(gen, 8, 6, "tree", "probs", WITHOUT_REPLACEMENT)
    target_probs = torch.softmax(torch.randn(9, 6, generator=gen), -1)
    verdicts = [accept_sampling(tree, target_probs, TorchRandom(torch.Generator().manual_seed(seed)))
                for seed in (5, 5, 6)]
    assert verdicts[0] == verdicts[1]
    assert all(v.accepted_tokens == tuple(tree.tokens[list(v.accepted)].tolist()) for v in verdicts)


@pytest.mark.parametrize("draft", ["none", "probs"])
def test_zero_residual_mid_siblings_matches_the_walk(draft):
    """The first child's rejection (probability 0) leaves an all-zero residual while siblings are
    still to be tried: the host finishes that node; every outcome, weight-0 ones included, agrees
    with the walk."""
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    rows = torch.stack([one_hot, torch.tensor([0.0, 0.5, 0.5, 0.0]), torch.full((4,), 0.25)])
    tree = CandidateTree(torch.tensor([1, 2, 3]), (-1, -1, 0), rows if draft == "probs" else None)
    target_probs = torch.stack([one_hot, torch.full((4,), 0.25), torch.full((4,), 0.25), torch.full((4,), 0.25)])
    law = enumerate_law(lambda rng: (lambda v: (v.accepted, v.next_token))(accept_sampling(tree, target_probs, rng)),
                        explore_zero=True)
    expected = enumerate_law(lambda rng: reference_sampling(tree, target_probs, rng), explore_zero=True)
    assert set(law) == set(expected) and total_variation(law, expected) < 1e-9
