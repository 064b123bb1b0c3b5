"""The verifier's tree forward equals plain forwards of each root-to-node path; commit keeps the
cache consistent (gather and crop); and the pure tree functions."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from conftest import tiny_model
from specdec.tree import (CandidateTree, ancestor_matrix, children_of, depths_of, is_chain,
                          root_to_leaf_paths, tree_attention_mask, tree_position_ids, tree_visibility,
                          with_pending_root)
from specdec.verifier import Verifier


ATOL = 1e-5
PROMPT = [5, 17, 33, 9, 41, 60]
# A non-chain tree:          pending
#                           /       \
#                        n0(11)     n2(13)
#                       /    \         \
#                   n1(12)  n5(16)    n4(15)
#                     |                 |
#                   n3(14)            n6(17)
TOKENS = [11, 12, 13, 14, 15, 16, 17]
PARENTS = (-1, 0, -1, 1, 2, 0, 4)


@lru_cache(maxsize=None)
def model_of(arch: str):
    return tiny_model(arch, seed=0)


def path_tokens(tree: CandidateTree, node: int) -> list[int]:
    """Tokens on the root-to-node path, root first."""
    tokens = []
    while node != -1:
        tokens.append(int(tree.tokens[node]))
        node = tree.parents[node]
    return tokens[::-1]


@torch.no_grad()
def full_forward(model, ids: list[int]):
    """Plain forward over the whole sequence, no cache: (last logits [V], last hidden [H])."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0, -1], out.hidden_states[-1][0, -1]


# How the target's KV cache is held: grown as needed (no capacity given), sized once (the
# Speculator's way), or the fixed-size SlotLayer cache of `compile: true` run eagerly (no bucket:
# its masks over the whole buffer and its commit, without the compiler's time).
CACHES = ["grown", "sized", "static"]


def prefilled(model, prompt=PROMPT, cache: str = "grown") -> Verifier:
    verifier = Verifier(model, compile=cache == "static")
    if cache == "static":
        verifier.static.buckets = ()          # every forward takes the eager path over the static cache
    if cache == "sized":
        verifier.reserve(len(prompt) + 32)
    verifier.prefill(prompt[:-1])
    return verifier


def cache_length(verifier: Verifier) -> int:
    """Committed entries the cache holds (a static cache holds stale slots too: its length is the
    verifier's prefix_len by construction)."""
    return verifier.prefix_len if verifier.static is not None else verifier.cache.get_seq_length()


# ---------------------------------------------------------------------- tree forward
def test_tree_forward_equals_path_forwards(arch):
    model = model_of(arch)
    tree = CandidateTree(torch.tensor(TOKENS), PARENTS)
    assert not tree.is_chain
    verifier = prefilled(model)
    out = verifier.forward(PROMPT[-1], tree, feature_layers=(-1,))
    assert out.logits.shape == (1 + tree.num_nodes, model.config.vocab_size)
    assert out.hidden.shape == (1 + tree.num_nodes, out.hidden.shape[-1])
    logits, hidden = full_forward(model, PROMPT)
    torch.testing.assert_close(out.logits[0], logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden[0], hidden, atol=ATOL, rtol=0)
    for node in range(tree.num_nodes):
        logits, hidden = full_forward(model, PROMPT + path_tokens(tree, node))
        torch.testing.assert_close(out.logits[node + 1], logits, atol=ATOL, rtol=0, msg=f"node {node}")
        torch.testing.assert_close(out.hidden[node + 1], hidden, atol=ATOL, rtol=0, msg=f"node {node}")


def test_chain_forward_equals_full_forward(arch):
    model = model_of(arch)
    tree = CandidateTree.chain([11, 12, 13])
    out = prefilled(model).forward(PROMPT[-1], tree)
    for node in range(3):
        logits, _ = full_forward(model, PROMPT + path_tokens(tree, node))
        torch.testing.assert_close(out.logits[node + 1], logits, atol=ATOL, rtol=0)


def test_empty_tree_forward_is_next_token_logits(arch):
    model = model_of(arch)
    out = prefilled(model).forward(PROMPT[-1], CandidateTree.empty())
    assert out.logits.shape[0] == 1
    torch.testing.assert_close(out.logits[0], full_forward(model, PROMPT)[0], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------- commit
# accepted path (node indices) -> which commit code path it takes
COMMITS = {
    "gather": (2, 4, 6),      # rows [0, 3, 5, 7]: not a leading run -> index_select + move
    "gather_partial": (0, 5),  # rows [0, 1, 6]
    "crop": (0, 1),           # rows [0, 1, 2]: a leading run -> crop only
    "none": (),               # rows [0]: only the pending token
}


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("kind", sorted(COMMITS))
def test_commit_then_continue_equals_fresh_forward(arch, kind, cache):
    model = model_of(arch)
    tree = CandidateTree(torch.tensor(TOKENS), PARENTS)
    accepted = COMMITS[kind]
    verifier = prefilled(model, cache=cache)
    verifier.forward(PROMPT[-1], tree)
    verifier.commit([0] + [node + 1 for node in accepted])
    committed = PROMPT + [TOKENS[node] for node in accepted]
    assert verifier.prefix_len == len(committed)
    assert cache_length(verifier) == len(committed)
    # continued decoding: one more (pending) token, then a second tree on top
    next_token = 42
    out = verifier.forward(next_token, CandidateTree.empty())
    torch.testing.assert_close(out.logits[0], full_forward(model, committed + [next_token])[0], atol=ATOL, rtol=0)
    verifier.commit([0])
    committed.append(next_token)
    second = CandidateTree(torch.tensor([21, 22, 23, 24]), (-1, -1, 0, 1))
    out = verifier.forward(50, second)
    torch.testing.assert_close(out.logits[0], full_forward(model, committed + [50])[0], atol=ATOL, rtol=0)
    for node in range(second.num_nodes):
        expected = full_forward(model, committed + [50] + path_tokens(second, node))[0]
        torch.testing.assert_close(out.logits[node + 1], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("cache", CACHES)
def test_many_steps_of_random_trees_and_commits(arch, cache):
    """A run of random trees and random accepted paths keeps the cache equal to a fresh forward."""
    model = model_of(arch)
    gen = torch.Generator().manual_seed(0)
    verifier = prefilled(model, cache=cache)
    committed = list(PROMPT[:-1])
    pending = PROMPT[-1]
    for _ in range(6):
        n = int(torch.randint(1, 8, (), generator=gen))
        parents = tuple(int(torch.randint(-1, i, (), generator=gen)) if i else -1 for i in range(n))
        tree = CandidateTree(torch.randint(3, 96, (n,), generator=gen), parents)
        out = verifier.forward(pending, tree)
        context = committed + [pending]
        torch.testing.assert_close(out.logits[0], full_forward(model, context)[0], atol=ATOL, rtol=0)
        for node in range(n):
            expected = full_forward(model, context + path_tokens(tree, node))[0]
            torch.testing.assert_close(out.logits[node + 1], expected, atol=ATOL, rtol=0)
        leaf_paths = root_to_leaf_paths(parents)
        path = leaf_paths[int(torch.randint(0, len(leaf_paths), (), generator=gen))]
        path = path[: int(torch.randint(0, len(path) + 1, (), generator=gen))]
        verifier.commit([0] + [node + 1 for node in path])
        committed = context + [int(tree.tokens[node]) for node in path]
        pending = int(torch.randint(3, 96, (), generator=gen))
        assert verifier.prefix_len == len(committed) == cache_length(verifier)


# ---------------------------------------------------------------------- pure functions
def test_tree_attention_mask():
    prefix = 3
    mask = tree_attention_mask(PARENTS, prefix)
    n = len(PARENTS)
    assert mask.shape == (1, 1, n, prefix + n)
    assert mask.dtype == torch.float32
    neg = torch.finfo(torch.float32).min
    assert (mask[0, 0, :, :prefix] == 0).all(), "every node sees the whole prefix"
    ancestors = {0: {0}, 1: {0, 1}, 2: {2}, 3: {0, 1, 3}, 4: {2, 4}, 5: {0, 5}, 6: {2, 4, 6}}
    for i in range(n):
        for j in range(n):
            expected = 0.0 if j in ancestors[i] else neg
            assert mask[0, 0, i, prefix + j].item() == expected, (i, j)
    half = tree_attention_mask(PARENTS, prefix, dtype=torch.float16)
    assert half.dtype == torch.float16 and half.min().item() == torch.finfo(torch.float16).min


def test_chain_mask_is_causal():
    mask = tree_attention_mask((-1, 0, 1, 2), 2)[0, 0, :, 2:]
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(mask == 0, causal)


@pytest.mark.parametrize("parents", [PARENTS, (-1, 0, 1, 2), (-1, -1, -1), ()])
@pytest.mark.parametrize("window", [None, 1, 2, 4])
def test_tree_visibility_from_its_definition(parents, window):
    """The one mask builder, entry by entry against its definition: node i (position prefix + depth)
    sees key k when k is a prefix slot or node i's ancestor-or-self, within the window (HF's rule:
    key position > query position - window); the capacity's extra slots are hidden; first_row drops
    the rows of nodes already fed."""
    prefix, capacity = 3, 3 + len(parents) + 4
    depth = depths_of(parents)

    def ancestors_of(i):
        found = {i}
        while parents[i] >= 0:
            i = parents[i]
            found.add(i)
        return found

    def sees(i, k):
        if k < prefix:
            key_position, visible = k, True
        elif k < prefix + len(parents):
            key_position, visible = prefix + depth[k - prefix], k - prefix in ancestors_of(i)
        else:
            return False
        return visible and (window is None or key_position > prefix + depth[i] - window)

    for first_row in range(len(parents) + 1):
        got = tree_visibility(parents, prefix, window=window, capacity=capacity, first_row=first_row)
        expected = [[sees(i, k) for k in range(capacity)] for i in range(first_row, len(parents))]
        assert got.tolist() == expected, (first_row, got.int().tolist())
        plain = tree_attention_mask(parents, prefix, window=window, first_row=first_row)[0, 0]
        assert torch.equal(plain == 0, got[:, : prefix + len(parents)])


def test_tree_position_ids():
    assert tree_position_ids(PARENTS, 10).tolist() == [[10, 11, 10, 12, 11, 11, 12]]
    assert tree_position_ids((-1, 0, 1), 0).tolist() == [[0, 1, 2]]
    assert depths_of(PARENTS) == [0, 1, 0, 2, 1, 1, 2]


def test_with_pending_root():
    assert with_pending_root(PARENTS) == (-1, 0, 1, 0, 2, 3, 1, 5)
    assert tree_position_ids(with_pending_root((-1, -1, 0)), 4).tolist() == [[4, 5, 5, 6]]


def test_root_to_leaf_paths_and_children():
    assert sorted(root_to_leaf_paths(PARENTS)) == sorted([[0, 1, 3], [0, 5], [2, 4, 6]])
    tree = CandidateTree(torch.tensor(TOKENS), PARENTS)
    assert sorted(root_to_leaf_paths(tree.parents)) == sorted([[0, 1, 3], [0, 5], [2, 4, 6]])
    assert tree.children(-1) == (0, 2)
    assert tree.children(0) == (1, 5)
    assert tree.children(3) == ()
    assert children_of(PARENTS)[0] == (0, 2)
    assert root_to_leaf_paths((-1, 0, 1)) == [[0, 1, 2]]
    assert root_to_leaf_paths(()) == []
    assert bool(ancestor_matrix(PARENTS)[6, 2]) and not bool(ancestor_matrix(PARENTS)[6, 0])


def test_is_chain():
    assert is_chain((-1, 0, 1, 2)) and is_chain(())
    assert not is_chain(PARENTS) and not is_chain((-1, -1))
    assert CandidateTree.chain([4, 5, 6]).is_chain
    assert CandidateTree.chain([4, 5, 6]).parents == (-1, 0, 1)


def test_from_paths_dedupes_shared_prefixes():
    tree = CandidateTree.from_paths([[7, 8, 9], [7, 8, 10], [7, 11], [12], [7, 8, 9]])
    assert tree.tokens.tolist() == [7, 8, 9, 10, 11, 12]
    assert tree.parents == (-1, 0, 1, 1, 0, -1)
    assert tree.draft_probs is None
    # every input path is a root-to-node path of the trie
    spelled = {tuple(int(tree.tokens[i]) for i in path) for path in root_to_leaf_paths(tree.parents)}
    assert spelled == {(7, 8, 9), (7, 8, 10), (7, 11), (12,)}


def test_from_paths_node_budget():
    tree = CandidateTree.from_paths([[1, 2, 3], [4, 5, 6]], max_nodes=4)
    assert tree.num_nodes == 4
    assert tree.tokens.tolist() == [1, 2, 3, 4]
    assert tree.parents == (-1, 0, 1, -1)
    # a path cut by the budget still reuses nodes that already exist
    tree = CandidateTree.from_paths([[1, 2], [1, 2, 3, 4]], max_nodes=3)
    assert tree.tokens.tolist() == [1, 2, 3] and tree.parents == (-1, 0, 1)


def test_select():
    tree = CandidateTree(torch.tensor(TOKENS), PARENTS)
    sub = tree.select([2, 4, 6])
    assert sub.tokens.tolist() == [13, 15, 17]
    assert sub.parents == (-1, 0, 1)
    assert sub.is_chain
    sub = tree.select([0, 2, 5])
    assert sub.tokens.tolist() == [11, 13, 16] and sub.parents == (-1, -1, 0)


def test_empty_tree():
    tree = CandidateTree.empty()
    assert tree.num_nodes == 0 and tree.tokens.dtype == torch.long
    assert root_to_leaf_paths(tree.parents) == [] and tree.children(-1) == ()


@pytest.mark.parametrize("tokens, parents, probs, siblings, phrase", [
    ([1, 2], (-1,), None, "independent", "tokens must be [N]"),
    ([[1, 2]], (-1, 0), None, "independent", "tokens must be [N]"),
    ([1, 2], (-1, 1), None, "independent", "a parent must come before its child"),
    ([1, 2], (0, -1), None, "independent", "a parent must come before its child"),
    ([1, 2], (-1, -2), None, "independent", "a parent must come before its child"),
    ([1, 2], (-1, 0), torch.ones(3, 5) / 5, "independent", "draft_probs must be [N, V]"),
    ([1, 2], (-1, 0), torch.ones(5) / 5, "independent", "draft_probs must be [N, V]"),
    ([1, 2], (-1, -1), None, "sorted", "siblings must be one of"),
])
def test_candidate_tree_validation(tokens, parents, probs, siblings, phrase):
    with pytest.raises(ValueError) as info:
        CandidateTree(torch.tensor(tokens), parents, probs, siblings)
    assert phrase in str(info.value)
