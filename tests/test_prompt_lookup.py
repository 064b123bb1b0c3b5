"""prompt_lookup: the trie it proposes, greedy identity with HF generate, exact-law losslessness
with its trees, and its config / API / CLI entry points."""
from __future__ import annotations

import random

import pytest
import torch

import specdec
from conftest import char_tokenizer, hf_greedy, tiny_model
from law import always_accept, enumerate_law, extend_to_length, random_table, sequence_law, total_variation
from specdec.acceptance import Verdict, accept_sampling
from specdec.errors import ConfigError
from specdec.sampling import SamplingParams, TorchRandom, logits_to_probs
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import CandidateTree, root_to_leaf_paths
from specdec.types import DecodeState, StepResult

EOS = 2   # eos_token_id of the tiny configs


def make_state(token_ids, max_depth=64, eos=()):
    return DecodeState(token_ids=list(token_ids), prompt_len=len(token_ids), sampling=SamplingParams(),
                       rng=TorchRandom(torch.Generator()), max_depth=max_depth, eos_token_ids=frozenset(eos))


def propose(context, max_depth=64, eos=(), **settings) -> CandidateTree:
    strategy = PromptLookup(**settings)
    state = make_state(context, max_depth, eos)
    strategy.reset(state)
    return strategy.propose(state)


def token_paths(tree: CandidateTree) -> list[list[int]]:
    tokens = tree.tokens.tolist()
    return [[tokens[node] for node in path] for path in root_to_leaf_paths(tree.parents)]


class Recording(PromptLookup):
    """PromptLookup that keeps every tree it proposed."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.trees: list[CandidateTree] = []

    def propose(self, state):
        tree = super().propose(state)
        self.trees.append(tree)
        return tree


# ----------------------------------------------------------------------------- the trie
#            0  1  2  3   4   5  6  7  8   9  10 11 12  13  14 15 16 17  18  19 20
CONTEXT = [5, 6, 7, 8, 9, 5, 6, 7, 3, 9, 5, 6, 4, 9, 5, 6, 7, 8, 9, 5, 6]
# suffix (5, 6) ends at 1, 6, 11, 15 (and 20: itself); continuations of 3 tokens, newest first:
# 15 -> 7 8 9, 11 -> 4 9 5, 6 -> 7 3 9, 1 -> 7 8 9 (a duplicate)


def test_trie_holds_the_distinct_continuations_newest_first():
    strategy = PromptLookup(min_ngram=1, max_ngram=2, num_tokens=3, max_matches=4, max_nodes=40)
    state = make_state(CONTEXT)
    strategy.reset(state)
    assert strategy.continuations(CONTEXT, 3) == [[7, 8, 9], [4, 9, 5], [7, 3, 9]]
    tree = strategy.propose(state)
    assert tree.draft_probs is None
    assert sorted(token_paths(tree)) == sorted([[7, 8, 9], [4, 9, 5], [7, 3, 9]])
    assert tree.num_nodes == 8                       # the shared first token 7 is one node
    assert tree.tokens[tree.children(-1)[0]] == 7    # the newest continuation comes first


def test_trie_respects_node_budget_and_match_count():
    tree = propose(CONTEXT, min_ngram=1, max_ngram=2, num_tokens=3, max_matches=4, max_nodes=5)
    assert tree.num_nodes == 5
    assert sorted(token_paths(tree)) == [[4, 9], [7, 8, 9]]      # the oldest continuation is cut
    tree = propose(CONTEXT, min_ngram=1, max_ngram=2, num_tokens=3, max_matches=2)
    assert sorted(token_paths(tree)) == [[4, 9, 5], [7, 8, 9]]


def test_longer_ngrams_come_first_then_shorter_ones_fill_the_budget():
    #          0  1  2  3  4  5  6  7  8  9 10
    context = [1, 5, 6, 7, 9, 5, 6, 8, 1, 5, 6]
    # (1, 5, 6) ends at 2 -> 7 9; then (5, 6) adds 6 -> 8 1; then (6,) adds nothing new
    strategy = PromptLookup(min_ngram=1, max_ngram=3, num_tokens=2, max_matches=4)
    strategy.reset(make_state(context))
    assert strategy.continuations(context, 2) == [[7, 9], [8, 1]]
    strategy = PromptLookup(min_ngram=3, max_ngram=3, num_tokens=2, max_matches=4)
    strategy.reset(make_state(context))
    assert strategy.continuations(context, 2) == [[7, 9]]


def test_a_continuation_cut_by_the_context_end_merges_into_its_longer_twin():
    context = [1, 2, 3, 1, 2, 3, 1, 2]
    # (1, 2) ends at 4 -> 3 1 2 (the context ends), and at 1 -> 3 1 2 3
    assert token_paths(propose(context, max_ngram=2, num_tokens=4)) == [[3, 1, 2, 3]]


def test_nothing_is_proposed_past_an_eos():
    context = [4, 5, 2, 7, 4, 5, 8, 2, 9, 4, 5]
    tree = propose(context, eos=(EOS,), max_ngram=2, num_tokens=4)
    assert sorted(token_paths(tree)) == [[2], [8, 2]]
    # without EOS ids (ignore_eos) the continuations run on
    assert sorted(token_paths(propose(context, max_ngram=2, num_tokens=4))) == [[2, 7, 4, 5], [8, 2, 9, 4]]


def test_no_match_and_max_depth():
    assert propose([3, 4, 5, 6, 7]).num_nodes == 0
    assert propose([9]).num_nodes == 0
    assert token_paths(propose(CONTEXT, max_depth=1, max_ngram=2)) == [[7], [4]]
    assert propose(CONTEXT, max_depth=0).num_nodes == 0


def brute_force_continuations(context, min_n, max_n, depth, max_matches, eos=()):
    """Reference: scan every position for every n (what the index avoids doing)."""
    found: list[list[int]] = []
    length = len(context)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = context[length - n:]
        for end in range(length - 2, n - 2, -1):
            if context[end - n + 1: end + 1] != suffix:
                continue
            cont = context[end + 1: end + 1 + depth]
            cut = next((i + 1 for i, t in enumerate(cont) if t in eos), len(cont))
            cont = cont[:cut]
            twin = next((i for i, p in enumerate(found) if p[:len(cont)] == cont[:len(p)]), None)
            if twin is None:
                found.append(cont)
                if len(found) == max_matches:
                    return found
            elif len(cont) > len(found[twin]):
                found[twin] = cont
    return found


def test_incremental_index_matches_a_brute_force_scan():
    rng = random.Random(0)
    for trial in range(30):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        strategy = PromptLookup(min_ngram=1, max_ngram=3, num_tokens=4, max_matches=3)
        state = make_state(context, eos=(2,))
        strategy.reset(state)
        for _step in range(6):                          # the loop's order: propose, commit, observe
            tree = strategy.propose(state)
            expected = brute_force_continuations(state.token_ids, 1, 3, 4, 3, eos=(2,))
            assert strategy.continuations(state.token_ids, 4, (2,)) == expected, (trial, state.token_ids)
            assert sorted(token_paths(tree)) == sorted(expected)
            before = len(state.token_ids)
            state.token_ids.extend(rng.randrange(5) for _ in range(rng.randrange(1, 4)))
            strategy.observe(state, StepResult(tree, (), 0, before))


def test_constructor_defaults_are_the_config_defaults():
    from specdec.strategies.prompt_lookup import PromptLookupConfig
    defaults = PromptLookupConfig()
    strategy = PromptLookup()
    for key in ("min_ngram", "max_ngram", "num_tokens", "max_matches", "max_nodes"):
        assert getattr(strategy, key) == getattr(defaults, key), key


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="min_ngram"):
        PromptLookup(min_ngram=3, max_ngram=2)
    with pytest.raises(ConfigError, match="num_tokens"):
        PromptLookup(num_tokens=0)


# ----------------------------------------------------------------------------- greedy identity
TRIE_PROMPT = [5, 6, 7, 5, 6, 8, 5, 6, 7, 9, 5, 6, 7, 5, 6]      # many overlapping repeats
NO_MATCH_PROMPT = list(range(20, 36))                          # every token distinct
EOS_PROMPT = [10, 11, 12, 2, 10, 11, 12, 2, 10, 11]            # matches run into EOS


def run_both(model, prompt, max_new_tokens, **settings):
    """(HF greedy tokens, our output, the trees our strategy proposed)."""
    strategy = Recording(**settings)
    out = specdec.Speculator(model, None, strategy).generate(prompt, max_new_tokens=max_new_tokens)
    return hf_greedy(model, prompt, max_new_tokens), out, strategy.trees


def test_greedy_identity(arch):
    settings = dict(max_ngram=3, num_tokens=6, max_matches=4, max_nodes=16)
    model = tiny_model(arch, seed=0)
    # matches run into EOS: the first proposal stops after the EOS; both stop where EOS comes
    expected, out, trees = run_both(model, EOS_PROMPT, 20, **settings)
    assert out.token_ids == expected
    assert token_paths(trees[0]) == [[12, EOS]]
    # EOS off (HF generate and the Speculator both read it from the generation config), so that
    # the runs are long and the lookup also matches the generated tokens
    model.generation_config.eos_token_id = None
    expected, out, trees = run_both(model, TRIE_PROMPT, 20, **settings)
    assert out.token_ids == expected
    assert trees[0].num_nodes > 1 and not trees[0].is_chain           # overlapping matches: a trie
    expected, out, trees = run_both(model, NO_MATCH_PROMPT, 20, **settings)
    assert out.token_ids == expected
    assert trees[0].num_nodes == 0                                    # no match: a plain step
    expected, out, trees = run_both(model, EOS_PROMPT, 20, **settings)
    assert out.token_ids == expected
    assert token_paths(trees[0]) == [[12, EOS, 10, 11, 12, EOS]]      # ignored EOS: runs on


def test_tokens_per_forward_above_one_when_the_model_repeats():
    model = tiny_model("gpt2", seed=0)                   # this tiny model falls into a loop
    prompt = [10, 11, 12, 13] * 4 + [10, 11]
    out = specdec.Speculator(model, None, PromptLookup()).generate(prompt, max_new_tokens=40)
    assert out.token_ids == hf_greedy(model, prompt, 40)
    assert out.stats.tokens_per_forward > 1.5
    assert sum(out.stats.accepted_lengths) > 0


def test_a_drafted_eos_is_accepted_and_stops_the_run(arch):
    """EOS inside an accepted run: a token of the model's greedy loop is declared EOS, so the
    lookup proposes it (cut after it) and the target accepts it; output equals HF's."""
    model = tiny_model(arch, seed=1 if arch == "qwen2" else 0)   # seeds whose greedy output loops
    model.generation_config.eos_token_id = None
    looping = hf_greedy(model, EOS_PROMPT, 40)           # every tiny model here ends in a loop
    prompt = EOS_PROMPT + looping[:30]
    ahead = looping[30:]                                 # what greedy decoding continues with
    stop_at = next(i for i, t in enumerate(ahead) if t in prompt[-12:] and t not in ahead[:i])
    model.generation_config.eos_token_id = ahead[stop_at]
    expected = hf_greedy(model, prompt, 10)
    assert expected == ahead[: stop_at + 1]
    strategy = Recording(max_ngram=3, num_tokens=8)
    out = specdec.Speculator(model, None, strategy).generate(prompt, max_new_tokens=10)
    assert out.token_ids == expected and out.finish_reason == "eos"
    emitted_in_last_step = out.stats.new_tokens - (len(out.stats.accepted_lengths) - 1) - sum(out.stats.accepted_lengths[:-1])
    assert out.stats.accepted_lengths[-1] == emitted_in_last_step, "the EOS should be a drafted, accepted token"


# ----------------------------------------------------------------------------- exact law
V = 4
LENGTH = 3
LAW_CONTEXTS = {
    # (0, 1) ends at 1, 4, 7 -> continuations 2 3 / 3 0 / 2 0: a trie 2 -> {3, 0}, 3 -> 0
    "trie": [0, 1, 2, 0, 1, 3, 0, 1, 2, 3, 0, 1],
    # (3,) repeats with four different followers: four siblings of one token each
    "wide": [3, 0, 3, 1, 3, 2, 3, 3, 3],
}


def lookup_emission_law(context, target, verify):
    tree = propose(context, min_ngram=1, max_ngram=2, num_tokens=2, max_matches=4)
    assert tree.num_nodes > 1 and tree.draft_probs is None
    tokens = tree.tokens.tolist()
    node_context: list[tuple] = []                     # token path from the pending token to node i
    for i, parent in enumerate(tree.parents):
        node_context.append((node_context[parent] if parent >= 0 else ()) + (tokens[i],))
    target_probs = torch.stack([target(())] + [target(c) for c in node_context]).double()   # [1 + N, V]

    def one_step(rng):
        verdict = verify(tree, target_probs, rng)
        return tuple(tokens[n] for n in verdict.accepted) + (verdict.next_token,)
    return tree, enumerate_law(one_step)


def context_target(context, seed, params):
    table = random_table(V, seed=seed)

    def target(ctx):
        probs = table(tuple(context) + tuple(ctx))
        if params != SamplingParams(1.0):
            probs = logits_to_probs(probs.log(), params).double()
            probs = probs / probs.sum()                # exactly normalised in float64
        return probs
    return target


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=2)], ids=["plain", "top-k"])
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("shape", LAW_CONTEXTS)
def test_sampling_with_lookup_trees_is_lossless(shape, seed, params):
    context = LAW_CONTEXTS[shape]
    target = context_target(context, seed, params)
    tree, law = lookup_emission_law(context, target, accept_sampling)
    if shape == "trie":
        assert sorted(token_paths(tree)) == [[2, 0], [2, 3], [3, 0]]
    assert abs(sum(law.values()) - 1) < 1e-12
    tv = total_variation(extend_to_length(law, target, LENGTH), sequence_law(target, LENGTH))
    assert tv < 1e-9, f"{shape}: output law differs from the target's (TV {tv:.2e})"


@pytest.mark.parametrize("shape", LAW_CONTEXTS)
def test_law_negative_control(shape):
    context = LAW_CONTEXTS[shape]
    target = context_target(context, 3, SamplingParams(1.0))
    _, law = lookup_emission_law(context, target, always_accept)
    tv = total_variation(extend_to_length(law, target, LENGTH), sequence_law(target, LENGTH))
    assert tv > 0.05, "the law test must catch an acceptance that keeps the first child"


# ----------------------------------------------------------------------------- config / API / CLI
@pytest.fixture
def saved_model(tmp_path):
    model = tiny_model("llama", seed=0)
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    return model, str(tmp_path)


def test_load_by_name_and_yaml_path(saved_model):
    from specdec.config import find_config_file
    model, path = saved_model
    text = "abcabcabdabcab"
    ids = char_tokenizer()(text)["input_ids"]
    expected = hf_greedy(model, ids, 12)
    for config in ("prompt_lookup", find_config_file("prompt_lookup")):
        sd = specdec.load(config, **{"target.path": path, "device": "cpu", "dtype": "float32",
                                     "prompt_lookup.num_tokens": 5, "prompt_lookup.max_nodes": 12})
        assert isinstance(sd.strategy, PromptLookup)
        assert (sd.strategy.num_tokens, sd.strategy.max_nodes, sd.strategy.max_ngram) == (5, 12, 3)
        out = sd.generate(text, max_new_tokens=12)
        assert out.token_ids == expected
    with pytest.raises(ConfigError, match="min_ngram"):
        specdec.load("prompt_lookup", **{"target.path": path, "device": "cpu", "prompt_lookup.min_ngram": 0})
    with pytest.raises(ConfigError, match="max_ngram"):
        specdec.load("prompt_lookup", **{"target.path": path, "device": "cpu", "prompt_lookup.max_ngrams": 4})


def test_speculator_by_name():
    model = tiny_model("qwen2", seed=1)
    tok = char_tokenizer()
    sd = specdec.Speculator(model, tok, "prompt_lookup")
    assert isinstance(sd.strategy, PromptLookup)
    text = "def f(x): return x\ndef f(y): return y\ndef f("
    out = sd.generate(text, max_new_tokens=10)
    assert out.token_ids == hf_greedy(model, tok(text)["input_ids"], 10)
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)


def test_cli_generate(saved_model, capsys):
    from specdec.cli import main
    model, path = saved_model
    text = "xyzxyzxy"
    code = main(["generate", "prompt_lookup", f"target.path={path}", "device=cpu", "dtype=float32",
                 "generation.max_new_tokens=6", "--prompt", text, "--no-stream"])
    assert code == 0
    captured = capsys.readouterr()
    tok = char_tokenizer()
    expected = tok.decode(hf_greedy(model, tok(text)["input_ids"], 6), skip_special_tokens=True)
    assert captured.out == expected + "\n"
    assert "[prompt_lookup]" in captured.err
