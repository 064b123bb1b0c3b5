"""suffix (SuffixDecoding): the suffix tree, the drafts it scores, the bounded, scoped, persistent
cross-call cache, and exactness through the real loop (greedy identity on several architectures)."""
from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import hf_greedy, tiny_model
from specdec import Speculator
from specdec.config import load_spec_config
from specdec.errors import ConfigError, InputError
from specdec.sampling import SamplingParams, TorchRandom
from specdec.tree import root_to_leaf_paths
from specdec.strategies.suffix import Suffix, SuffixCacheError, read_cache_file
from specdec.strategies.suffix_tree import SuffixTree
from specdec.types import DecodeState

PROMPT = [5, 17, 33, 9, 41, 60, 70]
N = 24


def rebuilt(streams: dict[int, list[int]], depth: int) -> SuffixTree:
    tree = SuffixTree(depth)
    for stream, tokens in streams.items():
        tree.extend(stream, tokens)
    return tree


def state_of(tokens: list[int], scope: str | None = None, max_depth: int = 16) -> DecodeState:
    return DecodeState(token_ids=list(tokens), prompt_len=len(tokens), sampling=SamplingParams(0.0),
                       rng=TorchRandom(torch.Generator()), max_depth=max_depth, cache_scope=scope)


def paths_of(tree) -> list[tuple[int, ...]]:
    """Root-to-leaf token paths of a CandidateTree."""
    tokens = tree.tokens.tolist()
    return [tuple(tokens[node] for node in path) for path in root_to_leaf_paths(tree.parents)]


# ---------------------------------------------------------------------- the tree
@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_a_rebuild_after_every_step(seed):
    """Random streams over a small vocabulary (many repeats) appended in random chunks, streams
    removed and added: after every change the tree holds exactly the substrings (<= depth) and
    counts that a tree built from scratch over the remaining streams holds."""
    rng = random.Random(seed)
    depth = rng.randint(1, 7)
    tree, streams = SuffixTree(depth), {}
    for step in range(60):
        action = rng.random()
        if action < 0.15 and streams:
            victim = rng.choice(sorted(streams))
            tree.remove(victim)
            del streams[victim]
        else:
            stream = rng.randrange(4)
            chunk = [rng.randrange(5) for _ in range(rng.randint(0, 4))]
            tree.extend(stream, chunk)
            streams.setdefault(stream, []).extend(chunk)
        fresh = rebuilt(streams, depth)
        assert tree.as_counts() == fresh.as_counts(), f"step {step}"
        assert tree.num_nodes == fresh.num_nodes
        assert tree.num_tokens == sum(map(len, streams.values()))
    assert tree.as_counts(), "precondition: the streams left something to compare"


def test_counts_and_probabilities():
    tree = rebuilt({0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 4, 5]}, depth=6)
    node = tree.match([1, 2])
    assert (tree.count[node], tree.cont[node]) == (3, 3)
    tokens, parents, probs = tree.best_tree(node, max_nodes=8, max_levels=8, min_prob=0.1)
    assert tokens == [3, 4, 5] and parents == [-1, -1, 1]
    assert probs == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert tree.best_tree(node, 8, 8, min_prob=0.5)[0] == [3]       # 4 and 5 are cut
    assert tree.best_path(node, 8, 0.1)[0] == [3]                   # [1, 2, 3] ends: nothing after 3
    assert tree.best_tree(node, 8, max_levels=1, min_prob=0.1)[0] == [3, 4]
    assert tree.best_path(node, 8, 0.1, stop=frozenset({3}))[0] == [3]
    assert tree.match([2, 2]) == -1


def test_an_occurrence_at_the_end_does_not_dilute_the_estimate():
    """[7, 8] occurs twice, once at the end of the stream: what followed the other one is certain."""
    tree = rebuilt({0: [7, 8, 9, 7, 8]}, depth=6)
    tokens, _, probs = tree.best_path(tree.match([7, 8]), 4, 0.1)
    assert tokens == [9, 7, 8] and probs == pytest.approx([1.0, 1.0, 1.0])


# ---------------------------------------------------------------------- drafting
def test_speculation_length_grows_with_the_match():
    """max_spec_factor=1: a 1-token match may draft 1 node, a 3-token match 3."""
    suffix = Suffix(max_nodes=8, max_spec_factor=1.0, min_token_prob=0.0, min_match=1)
    suffix.cache.add("default", [40, 41, 42, 43, 44, 45, 46, 47])
    suffix.reset(state_of([1, 2, 42]))
    assert suffix.propose(state_of([1, 2, 42])).num_nodes == 1
    state = state_of([1, 41, 42, 43])
    suffix.reset(state)
    assert suffix.propose(state).tokens.tolist() == [44, 45, 46]


def test_matches_shorter_than_min_match_draft_nothing():
    """The default min_match=2: a 1-token match drafts nothing; a 2-token match drafts
    max_spec_factor * 2 nodes (capped by max_nodes)."""
    suffix = Suffix(max_nodes=16, max_spec_factor=6.0, min_token_prob=0.0)
    assert suffix.min_match == 2
    suffix.cache.add("default", list(range(40, 70)))
    state = state_of([1, 2, 42])
    suffix.reset(state)
    assert suffix.propose(state).num_nodes == 0
    state = state_of([1, 41, 42])
    suffix.reset(state)
    assert suffix.propose(state).tokens.tolist() == list(range(43, 55))      # 12 nodes
    assert suffix.match_length == 2


def test_the_gate_pauses_drafts_that_keep_nothing_and_looks_again():
    """Drafted steps whose drafts keep nothing (kept < min_gain on average) pause drafting from that
    (temperature, match bucket); it is tried again after a gap that doubles; a bucket whose drafts
    are kept goes on drafting, and so does every step with min_gain 0."""
    from specdec.types import StepResult
    from specdec.tree import CandidateTree

    def steps(suffix, kept, n=40):
        drafted = []
        for _ in range(n):
            state = state_of([1, 2, 3, 4, 5, 1, 2])            # a 2-token match of its own prompt
            suffix.reset(state)
            tree = suffix.propose(state)
            drafted.append(tree.num_nodes > 0)
            accepted = tuple(range(min(kept, tree.num_nodes)))
            suffix.observe(state, StepResult(tree, accepted, 9, len(state.token_ids)))
        return drafted

    rejected = steps(Suffix(max_cached_tokens=0), kept=0)
    looks = [i for i, drafted in enumerate(rejected) if drafted]
    assert looks == [0, 1, 2, 3, 4, 5, 6, 10, 18, 34]   # 7 misses close it; looks after 3, 7, 15 skipped steps
    assert all(steps(Suffix(max_cached_tokens=0), kept=2))
    assert all(steps(Suffix(max_cached_tokens=0, min_gain=0.0), kept=0))
    shared = Suffix(max_cached_tokens=0)
    steps(shared, kept=0)
    state = state_of([7, 8, 9, 10, 7, 8, 9])                 # a 3-token match: another bucket, not paused
    shared.reset(state)
    assert shared.propose(state).num_nodes > 0


def _draft_every_length(suffix: Suffix, context: list[int], max_levels: int):
    """draft() by brute force: every match length from min_match up, scored, the longest best."""
    from specdec.strategies.suffix_tree import best_path, best_tree
    best = (0.0, ([], [], []), 0)
    trees = [suffix.local] + suffix.cache.trees_for(suffix.scope)
    for length in range(suffix.min_match, min(suffix.max_depth - 1, len(context)) + 1):
        parts = [(tree, tree.match(context[len(context) - length:])) for tree in trees]
        parts = [(tree, node) for tree, node in parts if node >= 0]
        budget = min(suffix.max_nodes, int(length * suffix.max_spec_factor + suffix.max_spec_offset + 1e-6))
        if not parts or budget <= 0:
            continue
        drafted = (best_tree(parts, budget, max_levels, suffix.min_token_prob, frozenset()) if suffix.tree
                   else best_path(parts, min(budget, max_levels), suffix.min_token_prob, frozenset()))
        if drafted[0] and sum(drafted[2]) >= best[0]:
            best = (sum(drafted[2]), drafted, length)
    return best[1], best[2]


@pytest.mark.parametrize("seed", range(8))
def test_the_pruned_search_drafts_what_scoring_every_match_length_drafts(seed):
    """draft() scores the longest matches first and stops where no shorter match's node budget can
    beat the best score: the same draft and match length as scoring every length (random streams
    over a small vocabulary, cached outputs and the call's own context, random settings)."""
    rng = random.Random(seed)
    drafted = 0
    for trial in range(20):
        suffix = Suffix(max_depth=rng.randint(3, 9), max_nodes=rng.randint(1, 10),
                        max_spec_factor=rng.choice([0.5, 1.0, 2.0, 6.0]), max_spec_offset=rng.choice([0.0, 1.0]),
                        min_token_prob=rng.choice([0.0, 0.1, 0.4]), min_match=rng.randint(1, 3),
                        tree=rng.random() < 0.7)
        for _ in range(rng.randint(0, 3)):
            suffix.cache.add("default", [rng.randrange(4) for _ in range(rng.randint(1, 30))])
        context = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        suffix.reset(state_of(context))
        expected, length = _draft_every_length(suffix, context, 8)
        assert suffix.draft(context, 8) == expected, f"trial {trial}"
        assert suffix.match_length == length
        drafted += bool(expected[0])
    assert drafted >= 5, "precondition: most trials draft something"


def test_the_most_frequent_continuations_form_a_tree():
    suffix = Suffix(max_nodes=8, max_spec_factor=4.0, min_token_prob=0.2)
    for tail in ([10, 11], [10, 11], [10, 12], [13, 14]):
        suffix.cache.add("default", [1, 2, 3] + tail)
    state = state_of([9, 2, 3])
    suffix.reset(state)
    tree = suffix.propose(state)
    assert sorted(paths_of(tree)) == [(10, 11), (10, 12), (13, 14)]   # 13 and 14 at 1/4 each
    assert tree.draft_probs is None                                 # point masses
    path = Suffix(max_nodes=8, max_spec_factor=4.0, min_token_prob=0.2, tree=False, cache=suffix.cache)
    path.reset(state)
    assert paths_of(path.propose(state)) == [(10, 11)]


def test_drafts_respect_the_depth_left_and_eos():
    suffix = Suffix(max_nodes=8, max_spec_factor=4.0)
    suffix.cache.add("default", [1, 2, 3, 4, 5, 2, 6, 7])
    state = state_of([1, 2, 3], max_depth=2)
    suffix.reset(state)
    assert max(suffix.propose(state).depths()) < 2
    state = state_of([1, 2, 3])
    state.eos_token_ids = frozenset({5})
    suffix.reset(state)
    assert paths_of(suffix.propose(state)) == [(4, 5)]             # nothing past an end of sequence


def test_the_local_tree_follows_the_output_incrementally():
    suffix = Suffix()
    state = state_of([1, 2, 3, 4, 1, 2])
    suffix.reset(state)
    assert paths_of(suffix.propose(state))[0][:2] == (3, 4)
    state.token_ids.extend([3, 4, 9, 1, 2])
    suffix.observe(state, None)
    assert suffix.local.as_counts() == rebuilt({0: state.token_ids}, suffix.max_depth).as_counts()


def test_a_match_is_drafted_from_every_tree_that_holds_it_with_counts_added():
    """This call's tree says 7 or 8 after (1, 2, 3), half and half; an earlier output says 7: with
    the counts added 7 has probability 2/3, over a 0.6 cut that neither tree alone clears for it."""
    from specdec.strategies.suffix_tree import best_path
    own, cached = rebuilt({0: [1, 2, 3, 7, 1, 2, 3, 8]}, 8), rebuilt({0: [1, 2, 3, 7]}, 8)
    match = [(tree, tree.match([1, 2, 3])) for tree in (own, cached)]
    assert best_path(match[:1], 4, 0.6)[0] == []
    tokens, _, probs = best_path(match, 4, 0.6)
    assert tokens[0] == 7 and probs[0] == pytest.approx(2 / 3)        # (then 1, 2, 3, as own tree goes on)
    alone, together = Suffix(min_token_prob=0.6, tree=False), Suffix(min_token_prob=0.6, tree=False)
    together.cache.add("default", [1, 2, 3, 7])
    for suffix in (alone, together):
        suffix.reset(state_of([1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3]))
    assert alone.draft(alone.state.token_ids, 4)[0] == []
    assert together.draft(together.state.token_ids, 4)[0][0] == 7 and together.match_length == 3


# ---------------------------------------------------------------------- the cache: bound, scopes, files
def test_eviction_keeps_the_bound_and_never_drops_the_active_request():
    suffix = Suffix(max_cached_tokens=20, max_spec_factor=4.0)
    state = state_of([50, 51, 52, 53, 54, 50, 51])
    suffix.reset(state)                                             # the active request: its prompt
    for k in range(12):
        suffix.cache.add("default", [60 + k] * 7)
        stats = suffix.cache_stats()
        assert stats["tokens"] <= 20 and stats["entries"] == min(k + 1, 2)
    assert [tokens[0] for _, tokens in suffix.cache.outputs()] == [70, 71]     # the newest two
    assert paths_of(suffix.propose(state))[0][:3] == (52, 53, 54)   # still drafts from its own prompt
    suffix.cache.add("default", list(range(100, 150)))              # longer than the bound: its end is kept
    assert suffix.cache.outputs() == [("default", list(range(130, 150)))]
    stats = suffix.cache_stats()
    assert stats["tokens"] == 20 and stats["memory_bytes"] > 0 and stats["nodes"] > 0


def foreign_drafts(second_scope: str) -> tuple[list, int]:
    """Scope A generates after PROMPT, then a call in `second_scope` after a prompt that ends like
    PROMPT: the second call's draft paths that are not in its own prompt + output (so came from
    another call's output), and how many drafts it made."""
    target = tiny_model("llama", seed=0)
    suffix = Suffix(max_spec_factor=4.0)
    sd = Speculator(target, None, suffix)
    drafts: list = []
    real_propose = suffix.propose

    def spy(state):
        tree = real_propose(state)
        if state.cache_scope == second_scope:
            drafts.extend(paths_of(tree))
        return tree

    suffix.propose = spy
    sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True, cache_scope="A")
    prompt_b = [11, 12, 13] + PROMPT
    drafts.clear()
    out_b = sd.generate(prompt_b, max_new_tokens=N, ignore_eos=True, cache_scope=second_scope).token_ids
    own = "," + ",".join(map(str, prompt_b + out_b)) + ","
    return [path for path in drafts if "," + ",".join(map(str, path)) + "," not in own], len(drafts)


def test_a_scope_never_drafts_what_only_another_scope_produced():
    foreign, drafted = foreign_drafts("B")
    assert foreign == [] and drafted > 0
    # control: in the same scope the second call does draft from the first call's output
    foreign, _ = foreign_drafts("A")
    assert foreign, "control: a shared scope should draft tokens only the other call produced"


def test_save_and_load_round_trip(tmp_path):
    suffix = Suffix(cache_path=str(tmp_path / "cache.json"))
    suffix.cache.add("A", [1, 2, 3, 4])
    suffix.cache.add("B", [5, 6, 7])
    suffix.save()
    loaded = Suffix(cache_path=str(tmp_path / "cache.json"))
    assert loaded.cache.outputs() == [("A", [1, 2, 3, 4]), ("B", [5, 6, 7])]
    assert loaded.cache.scopes["A"].as_counts() == suffix.cache.scopes["A"].as_counts()
    assert not list(tmp_path.glob("*.tmp")), "the temporary file was renamed into place"


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty", "bad entry"])
def test_a_corrupt_or_truncated_cache_is_a_clear_error(tmp_path, damage):
    path = tmp_path / "cache.json"
    suffix = Suffix()
    suffix.cache.add("A", list(range(3, 40)))
    suffix.save(path)
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) - 10])
    elif damage == "flipped":
        path.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not a cache")
    elif damage == "empty":
        path.write_bytes(b"")
    else:       # a well-formed file whose entry is not (scope, token ids)
        header, payload = raw.split(b"\n", 1)
        data = json.loads(payload)
        data["outputs"] = [["A", [1, -4]]]
        from specdec.strategies.suffix import SuffixCache
        import hashlib
        body = json.dumps(data).encode()
        meta = json.loads(header)
        meta.update(bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
        path.write_bytes(json.dumps(meta).encode() + b"\n" + body)
    with pytest.raises(SuffixCacheError) as err:
        Suffix(cache_path=str(path))
    message = str(err.value)
    assert str(path) in message and "delete the file" in message
    with pytest.raises(ConfigError):
        read_cache_file(path)


def test_a_cache_from_another_vocabulary_is_refused_at_bind():
    suffix = Suffix()
    suffix.cache.add("default", [3, 500])
    with pytest.raises(ConfigError, match="500"):
        Speculator(tiny_model("llama", seed=0), None, suffix)


def test_corpus_files_feed_every_scope(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([[20, 21, 22, 23, 24]]))
    cfg = load_spec_config("suffix", {"suffix.corpus": [str(tmp_path)], "suffix.max_spec_factor": 4.0})
    from specdec.strategies.suffix import from_config
    suffix = from_config(cfg, None, None, None, None)
    state = state_of([1, 21, 22], scope="anyone")
    suffix.reset(state)
    assert paths_of(suffix.propose(state)) == [(23, 24)]
    assert suffix.cache_stats()["corpus_tokens"] == 5
    with pytest.raises(ConfigError, match="neither a file nor a folder"):
        from_config(load_spec_config("suffix", {"suffix.corpus": [str(tmp_path / "missing")]}), None, None, None, None)
    (tmp_path / "b.txt").write_text("text")
    with pytest.raises(ConfigError, match="tokenizer"):
        from_config(cfg, None, None, None, None)


def test_config_and_argument_errors():
    with pytest.raises(ConfigError, match="max_nodes"):
        load_spec_config("suffix", {"suffix.max_nodes": 0})
    with pytest.raises(ConfigError, match="min_token_prob"):
        load_spec_config("suffix", {"suffix.min_token_prob": 1.5})
    sd = Speculator(tiny_model("llama", seed=0), None, Suffix())
    with pytest.raises(InputError, match="cache_scope"):
        sd.generate(PROMPT, max_new_tokens=4, cache_scope=17)
    with pytest.raises(ConfigError, match="path"):
        sd.strategy.save()


# ---------------------------------------------------------------------- exactness through the loop
@pytest.mark.parametrize("cached", ["reference", "disagreeing", "noisy"])
def test_greedy_identity(arch, cached):
    """Outputs equal HF greedy whatever the cache holds: the target's own text (drafts accepted in
    full), text that disagrees at every position (none accepted), or a partly corrupted copy."""
    target = tiny_model(arch, seed=0)
    reference = hf_greedy(target, PROMPT, N, eos_token_id=None)
    suffix = Suffix(max_spec_factor=4.0, max_nodes=8)
    if cached == "reference":
        suffix.cache.add("default", PROMPT[-3:] + reference)
    elif cached == "disagreeing":
        suffix.cache.add("default", PROMPT[-3:] + [(t + 1) % 90 + 3 for t in reference])
    else:
        suffix.cache.add("default", PROMPT[-3:] + [t if k % 5 else (t + 1) % 90 + 3 for k, t in enumerate(reference)])
    sd = Speculator(target, None, suffix)
    out = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference
    assert out.stats.proposed_nodes > 0
    if cached == "reference":
        assert out.stats.tokens_per_forward > 3
    if cached == "disagreeing":
        assert out.stats.accepted_lengths[0] == 0
    again = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True)      # now its own output is cached too
    assert again.token_ids == reference
    assert again.stats.tokens_per_forward > 3


def test_auto_drafts_from_earlier_calls_with_suffix_as_its_lookup():
    """auto.lookup_with=suffix: auto's copies come from suffix (this call's context and earlier
    calls' outputs), priced like prompt lookup's; a repeated request then needs fewer forwards,
    and every output is HF greedy's."""
    from conftest import char_tokenizer, hf_greedy, tiny_model
    from specdec import Speculator
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    from specdec.strategies.auto import Auto
    from specdec.strategies.suffix import Suffix
    target = tiny_model("llama", seed=1, sharpen=4.0)
    tokenizer = char_tokenizer()
    cfg = load_spec_config("auto", {"auto.lookup_with": "suffix", "auto.profile": False})
    strategy = build_strategy(cfg, target, tokenizer, target.device, target.dtype)
    assert isinstance(strategy, Auto) and isinstance(strategy.lookup, Suffix)
    sd = Speculator(target, tokenizer, strategy)
    prompt = "def parse(text):\n    return text.split()"
    expected = hf_greedy(target, tokenizer(prompt)["input_ids"], 40, eos_token_id=None)
    first = sd.generate(prompt, max_new_tokens=40, ignore_eos=True)
    second = sd.generate(prompt, max_new_tokens=40, ignore_eos=True)
    assert first.token_ids == expected and second.token_ids == expected
    assert second.stats.target_forwards < first.stats.target_forwards
    assert strategy.lookup.cache_stats()["tokens"] >= 40          # the finished calls' outputs, kept
    # suffix's nodes are calibrated under keys of their own, per match length, never as prompt lookup's
    tried = [key for key, count in strategy.calibrator.tried.items() if count > 0]
    assert any(key[0] == "suffix" and key[2] == "match" for key in tried)
    assert not any(key[0].startswith("lookup") for key in tried)


def test_auto_prices_suffix_nodes_by_their_match_length():
    """Two drafts with the same tree shape get different estimates once their match lengths'
    buckets have different records; prompt lookup (no match_length) keeps its depth keys."""
    import torch
    from specdec.sampling import SamplingParams, TorchRandom
    from specdec.strategies.auto import Auto, match_bucket
    from specdec.strategies.mixed import LOOKUP
    from specdec.tree import CandidateTree
    from specdec.types import DecodeState
    auto = Auto(None, None, profile=False)
    state = DecodeState(token_ids=[1, 2, 3], prompt_len=3, sampling=SamplingParams(0.0),
                        rng=TorchRandom(torch.Generator()), max_depth=4)
    chain = CandidateTree.chain([5, 6])
    auto.match_length = None
    plain = auto._node_keys(chain, [LOOKUP, LOOKUP], state)
    assert [key[0][0] for key in plain] == ["lookup", "lookup"]
    estimates = {}
    for length, kept in ((2, False), (20, True)):
        auto.match_length = length
        keys = auto._node_keys(chain, [LOOKUP, LOOKUP], state)
        assert [key[0][:4] for key in keys] == [("suffix", "greedy", "match", match_bucket(length))] * 2
        for _ in range(30):
            auto.calibrator.record(keys[0][0], kept)
        estimates[length] = auto._estimates(chain, [LOOKUP, LOOKUP], state)[0][0]
    assert match_bucket(2) != match_bucket(20)
    assert estimates[2] < 0.2 < 0.8 < estimates[20]
