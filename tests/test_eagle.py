"""The eagle strategy: greedy identity with all / none / partially accepted trees on five
architectures, the drafter cache after commits, the exact best tree, the file format."""
from __future__ import annotations

import itertools
import json
import os

import pytest
import torch
from torch import nn

from conftest import char_tokenizer, hf_greedy, tiny_model
from eagle_helpers import biased_target, echo_drafter, leaning_eagle3, random_drafter, state_for
from specdec.api import Speculator
from specdec.errors import ConfigError, IncompatibleModelsError, ModelLoadError
from specdec.heads.eagle import EagleDrafter, eagle3_layers, layout_for_target
from specdec.heads.eagle_io import CONFIG_FILE, WEIGHTS_FILE, load_eagle, save_eagle
from specdec.int8_linear import Int8Linear, int8_supported
from specdec.strategies.eagle import Eagle
from specdec.verifier import Verifier

PROMPT = list(range(5, 17))


def run(model, strategy, tokens: int = 40):
    sd = Speculator(model, None, strategy)
    out = sd.generate(PROMPT, max_new_tokens=tokens, ignore_eos=True)
    assert out.token_ids == hf_greedy(model, PROMPT, tokens, min_new_tokens=tokens)
    return out.stats.accepted_lengths


def test_greedy_identity_all_none_and_partial_acceptance(arch):
    depth = 4
    # all: the target always says 7; the drafter reads the same lm_head, so it says 7 at every depth
    always = biased_target(arch, 5.0, keep_weights=False)
    accepted = run(always, Eagle(random_drafter(always), max_nodes=6, top_k=2, depth=depth, table_chain=0))
    assert accepted[1:-1] and all(a == depth for a in accepted[1:-1])
    # ... and the table chain under the deepest leaf (the target's own top-1 after 7: 7) is kept whole too
    accepted = run(always, Eagle(random_drafter(always), max_nodes=6, top_k=2, depth=depth, table_chain=3))
    assert accepted[1:-1] and all(a == depth + 3 for a in accepted[1:-1])
    # none: an untrained drafter on a random target
    model = tiny_model(arch, seed=1, sharpen=4.0)
    for layers, vocab in [((-1,), None), (eagle3_layers(2), None), ((0, 1, 2), list(range(1, 96, 2)))]:
        accepted = run(model, Eagle(random_drafter(model, layers, draft_vocab=vocab), max_nodes=8, top_k=3, depth=depth))
        assert accepted.count(0) >= len(accepted) // 2
    # partial: a target leaning to 7 and a drafter echoing its feature (right early, drifting deeper);
    # at its own probabilities the drafter's tree is too bushy to reach the depth where it drifts
    leaning = biased_target(arch, 3.0)
    accepted = run(leaning, Eagle(echo_drafter(leaning), max_nodes=6, top_k=2, depth=depth, score_temperature=1.0,
                                  table_chain=0))
    assert any(0 < a < depth for a in accepted)


def test_one_token_prompt_and_budget():
    model = tiny_model("llama", seed=1, sharpen=4.0)
    sd = Speculator(model, None, Eagle(random_drafter(model), max_nodes=8, top_k=3, depth=6))
    for tokens in (1, 2, 5):
        out = sd.generate([9], max_new_tokens=tokens, ignore_eos=True)
        assert out.token_ids == hf_greedy(model, [9], tokens, min_new_tokens=tokens)


def _fresh_root(model, drafter, token_ids):
    """A fresh drafter run over the committed tokens' features (one prefill of the target)."""
    fresh = Eagle(drafter)
    fresh.bind(model, None)
    hidden = Verifier(model).prefill(token_ids[:-1], fresh.feature_layers)
    fresh.reset(state_for(token_ids, hidden))
    out, logits = fresh.catch_up(token_ids)
    return fresh, out, logits


@pytest.mark.parametrize("layers", [(-1,), (1, 2)])
def test_drafter_after_commits_equals_a_fresh_run(layers):
    model = biased_target("llama", 3.0)
    # seed 5: a random layer under which the EAGLE-3 drafter guesses 7 at some steps and not at others
    drafter = echo_drafter(model) if layers == (-1,) else leaning_eagle3(model, layers, seed=5)
    strategy = Eagle(drafter, max_nodes=6, top_k=2, depth=4)
    seen = []
    propose = strategy.propose

    def recording(state):
        tree = propose(state)
        seen.append((list(state.token_ids), strategy.root[0].clone(), strategy.root[1].clone(),
                     strategy.past_k.clone()))
        return tree

    strategy.propose = recording
    accepted = run(model, strategy, tokens=30)
    assert max(accepted) >= 2                        # multi-row commits happened
    for token_ids, out, logits, past_k in seen:
        fresh, fresh_out, fresh_logits = _fresh_root(model, drafter, token_ids)
        torch.testing.assert_close(out, fresh_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits, fresh_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(past_k, fresh.past_k, atol=1e-4, rtol=1e-4)


def test_kv_buffer_holds_what_concatenation_would():
    """Rows written at start..start+n, past its capacity (it grows) and over rows a rolled-back
    tree left (they are dropped), read back as torch.cat of the kept rows would give."""
    from specdec.cache import BufferedLayer
    from specdec.heads.eagle import write_rows
    buffer, kept = BufferedLayer(), []
    generator = torch.Generator().manual_seed(0)
    start = 0
    for n, commit in [(200, True), (3, False), (5, False), (100, True), (7, False), (1, True)]:
        k, v = torch.randn(2, 1, 2, n, 4, generator=generator)
        if not commit:                                  # a tree's rows: a level of 3 first, then these
            write_rows(buffer, start, *torch.randn(2, 1, 2, 3, 4, generator=generator))
        keys, values = write_rows(buffer, start if commit else start + 3, k, v)
        if commit:
            kept.append((k, v))
            start += n
            torch.testing.assert_close(keys, torch.cat([a for a, _ in kept], 2), rtol=0, atol=0)
            torch.testing.assert_close(values, torch.cat([b for _, b in kept], 2), rtol=0, atol=0)
        else:
            assert keys.shape[2] == start + 3 + n
            torch.testing.assert_close(keys[:, :, start + 3:], k, rtol=0, atol=0)
    past_v = buffer.value_buffer[:, :, :start]
    assert buffer.key_buffer.shape[2] >= 306 and start == 301
    torch.testing.assert_close(past_v, torch.cat([b for _, b in kept], 2), rtol=0, atol=0)
    fresh = Eagle(random_drafter(biased_target("llama", 3.0), (-1,)))
    assert fresh.past_k is None and fresh.past_v is None


@pytest.mark.parametrize("cache_kind", ["single", "ragged"])
def test_a_half_precision_drafter_attends_in_float32_over_a_float32_cache_on_cpu(cache_kind):
    """A bf16 drafter's cached attention on a CPU: its keys / values are kept in float32 and it attends
    in float32 (the float32 attention of the bf16 q / k / v), handing back bf16; training (no cache)
    stays in bf16."""
    from specdec.cache import BufferedLayer
    from specdec.heads.eagle import RaggedRows, attend
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, 8, generator=generator).bfloat16() for _ in range(3))   # [B, heads, n, d]
    past_k, past_v = (torch.randn(2, 4, 5, 8, generator=generator).bfloat16() for _ in range(2))
    visible = torch.ones(2, 3, 8, dtype=torch.bool).tril(5)
    if cache_kind == "single":
        caches = [BufferedLayer(), BufferedLayer()]
        for row, cache in enumerate(caches):
            empty = attend(q[row:row + 1, :, :0], past_k[row:row + 1], past_v[row:row + 1], cache=cache)
            assert empty.shape[2] == 0
        out = torch.cat([attend(q[row:row + 1], k[row:row + 1], v[row:row + 1], visible=visible[row:row + 1],
                                cache=cache, start=5) for row, cache in enumerate(caches)])
        stored = caches[0].key_buffer
    else:
        cache = RaggedRows()
        cache.prepare(None, torch.zeros(2, dtype=torch.long), 5, 2)
        attend(q[:, :, :0], past_k, past_v, cache=cache)
        cache.prepare(None, torch.full((2,), 5), 8, 2)
        out = attend(q, k, v, visible=visible, cache=cache)
        stored = cache.key_buffer
    assert stored.dtype == torch.float32 and out.dtype == torch.bfloat16
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), torch.cat([past_k, k], 2).float(), torch.cat([past_v, v], 2).float(), attn_mask=visible[:, None])
    torch.testing.assert_close(out, expected.bfloat16(), rtol=0, atol=0)
    trained = attend(q, k, v, past_k, past_v, visible)
    assert trained.dtype == torch.bfloat16
    assert not torch.equal(trained, out)        # bf16 attention: not the float32 one (the test can tell)


def _chain_children(drafter, strategy, path, top_k, temperature=1.0):
    """Reference without tree attention: feed the path node by node on top of the committed rows,
    return the (log-prob at `temperature`, token) list of the best children below its last node."""
    past_k, past_v = strategy.past_k, strategy.past_v
    g, logits = strategy.root
    for depth, token in enumerate(path):
        out, step_logits, k, v = drafter(g.view(1, 1, -1), torch.tensor([[token]]),
                                         torch.tensor([[strategy.fed + depth]]), past_k, past_v)
        past_k, past_v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        g, logits = out[0, 0], step_logits[0, 0]
    top = (logits.float() / temperature).log_softmax(-1).topk(top_k)
    return list(zip(top.values.tolist(), top.indices.tolist()))


@pytest.mark.parametrize("max_nodes,top_k,depth,temperature", [
    (1, 2, 3, 1.0), (4, 2, 3, 1.0), (7, 3, 3, 1.0), (12, 3, 4, 1.0), (5, 4, 2, 1.0), (7, 3, 3, 0.5), (12, 3, 4, 0.3)])
def test_greedy_tree_is_the_best_tree_by_cumulative_probability(max_nodes, top_k, depth, temperature):
    """The exact best tree by cumulative probability at score_temperature (1: the drafter's own)."""
    model = tiny_model("llama", seed=3, sharpen=2.0)
    drafter = random_drafter(model, seed=4)
    strategy = Eagle(drafter, max_nodes=max_nodes, top_k=top_k, depth=depth, expand=max_nodes, stop_below=0.0,
                     score_temperature=temperature, table_chain=0)         # the drafter's own tree, no table chain
    strategy.bind(model, None)
    hidden = Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers)
    state = state_for(PROMPT, hidden)
    strategy.reset(state)
    tree = strategy.propose(state)
    # brute force: every path of the top_k-ary candidate tree, scored by a sequential drafter run
    with torch.inference_mode():
        candidates = {}
        level = [((), 0.0)]
        for d in range(depth):
            nxt = []
            for path, score in level:
                for logprob, token in _chain_children(drafter, strategy, path, top_k, temperature):
                    candidates[path + (token,)] = score + logprob
                    nxt.append((path + (token,), score + logprob))
            level = nxt
    best = sorted(candidates, key=lambda p: (-candidates[p], len(p)))[:max_nodes]
    tokens = tree.tokens.tolist()
    got = set()
    for node in range(tree.num_nodes):
        path, i = [], node
        while i >= 0:
            path.append(tokens[i])
            i = tree.parents[i]
        got.add(tuple(reversed(path)))
    assert got == set(best)
    assert tree.num_nodes == min(max_nodes, len(candidates))


@pytest.mark.parametrize("layers,draft_vocab", [((-1,), None), ((0, 1, 2), None), ((0, 1, 2), [7, 3, 40, 9, 11])])
def test_save_load_round_trip_gives_identical_trees(tmp_path, layers, draft_vocab):
    model = tiny_model("llama", seed=1, sharpen=4.0)
    drafter = random_drafter(model, layers, draft_vocab=draft_vocab)
    save_eagle(str(tmp_path), drafter, model, training={"steps": 3})
    loaded = load_eagle(str(tmp_path), model)
    assert loaded.layout == drafter.layout and loaded.layout.fused == (len(layers) > 1)
    info = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert info["format"] == "specdec-eagle-drafter" and info["layout"]["feature_layers"] == list(layers)
    # the target's embedding is never saved; EAGLE-1 reads the target's lm_head, EAGLE-3 has its own
    assert "embed" not in " ".join(loaded.state_dict())
    assert ("lm_head" in " ".join(loaded.state_dict())) == (len(layers) > 1)
    if draft_vocab:
        assert sorted(loaded.draft_vocab.tolist()) == sorted(draft_vocab)
    trees = []
    for d in (drafter, loaded):
        sd = Speculator(model, None, Eagle(d, max_nodes=8, top_k=3, depth=4))
        trees.append(sd.generate(PROMPT, max_new_tokens=12, ignore_eos=True).stats.accepted_lengths)
    assert trees[0] == trees[1]


def test_drafter_for_another_target_is_refused(tmp_path):
    model = tiny_model("llama", seed=1)
    save_eagle(str(tmp_path), random_drafter(model), model)
    with pytest.raises(IncompatibleModelsError, match="fingerprint"):
        load_eagle(str(tmp_path), tiny_model("llama", seed=2))
    with pytest.raises(IncompatibleModelsError, match="architecture"):
        load_eagle(str(tmp_path), tiny_model("qwen2", seed=1))
    import specdec
    with pytest.raises(IncompatibleModelsError):
        Speculator(tiny_model("llama", seed=1, hidden=64), None, Eagle(random_drafter(model)))
    del specdec


def test_missing_or_corrupt_files_are_clear_errors(tmp_path):
    model = tiny_model("llama", seed=1)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_eagle(str(tmp_path / "nope"), model)
    with pytest.raises(ModelLoadError, match="no eagle.json"):
        load_eagle(str(tmp_path), model)
    save_eagle(str(tmp_path), random_drafter(model), model)
    with open(tmp_path / WEIGHTS_FILE, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_eagle(str(tmp_path), model)
    (tmp_path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ModelLoadError, match="corrupt"):
        load_eagle(str(tmp_path), model)


def test_config_and_load_through_the_api(tmp_path):
    import specdec
    from specdec.config import load_spec_config
    from specdec.models import load_model
    model = tiny_model("llama", seed=1)
    target_dir = tmp_path / "target"
    model.save_pretrained(target_dir)
    char_tokenizer().save_pretrained(target_dir)
    save_eagle(str(tmp_path / "eagle"), random_drafter(model), model)
    sd = specdec.load("eagle", **{"target.path": str(target_dir), "eagle.path": str(tmp_path / "eagle"),
                                 "eagle.max_nodes": 5, "device": "cpu"})
    assert isinstance(sd.strategy, Eagle) and sd.strategy.max_nodes == 5
    out = sd.generate(PROMPT, max_new_tokens=10, ignore_eos=True)
    assert out.token_ids == hf_greedy(load_model(str(target_dir), "t", torch.device("cpu"), torch.float32),
                                      PROMPT, 10, min_new_tokens=10)
    with pytest.raises(ConfigError, match="eagle.top_k"):
        load_spec_config("eagle", {"eagle.top_k": 0})
    with pytest.raises(ConfigError, match="eagle.dtype"):
        load_spec_config("eagle", {"eagle.dtype": "float64"})
    sd = specdec.load("eagle", **{"target.path": str(target_dir), "eagle.path": str(tmp_path / "eagle"),
                                 "eagle.dtype": "bfloat16", "eagle.score_temperature": 0.7, "device": "cpu"})
    assert next(sd.strategy.drafter.parameters()).dtype == torch.bfloat16 and sd.strategy.score_temperature == 0.7
    with pytest.raises(ModelLoadError, match="eagle.path"):
        specdec.load("eagle", **{"target.path": str(target_dir), "device": "cpu"})


def test_expand_bounds_the_drafter_rows_per_depth():
    model = tiny_model("llama", seed=3, sharpen=2.0)
    drafter = random_drafter(model, seed=4)
    rows = []
    drafter.register_forward_pre_hook(lambda module, args: rows.append(args[1].shape[1]))
    for expand, bound in ((2, 2), (None, 3), (20, 12)):
        strategy = Eagle(drafter, max_nodes=12, top_k=3, depth=4, expand=expand, stop_below=0.0, table_chain=0)
        strategy.bind(model, None)
        hidden = Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers)
        state = state_for(PROMPT, hidden)
        strategy.reset(state)
        rows.clear()
        tree = strategy.propose(state)
        tree_rows = rows[1:]                                  # rows[0]: the committed rows
        assert 1 <= len(tree_rows) <= 3 and max(tree_rows) <= bound and tree.num_nodes == 12
        if expand == 20:
            assert max(tree_rows) > 3                         # the exact tree expands more nodes


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_first_step_proposes_from_the_prefills_hidden_state(kind):
    """The very first verify step already checks a tree (from the prefill's features), not an empty one."""
    from specdec.api import Speculator
    from specdec.heads import HeadsLayout, MedusaHeads
    from specdec.heads.io import output_vocab
    from specdec.strategies.medusa import Medusa
    model = tiny_model("llama", seed=1, sharpen=4.0)
    if kind == "eagle":
        strategy = Eagle(random_drafter(model), max_nodes=6, top_k=2, depth=3)
    else:
        strategy = Medusa(MedusaHeads(HeadsLayout(2, 1, model.config.hidden_size, output_vocab(model))), max_nodes=4)
    sizes = []
    propose = strategy.propose

    def recording(state):
        tree = propose(state)
        sizes.append(tree.num_nodes)
        return tree
    strategy.propose = recording
    Speculator(model, None, strategy).generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert sizes[0] > 0


def test_stop_below_ends_the_expansion_where_the_frontier_holds_too_little_probability():
    """stop_below = s gives exactly the tree of a shallower depth limit, with no drafter forward past
    it; raising s never expands deeper; 0 always expands to `depth`; the output stays greedy's."""
    model = tiny_model("llama", seed=3, sharpen=2.0)
    drafter = random_drafter(model, seed=4)
    calls = []
    drafter.register_forward_pre_hook(lambda module, args: calls.append(1))

    def propose(depth=4, stop_below=0.0):
        strategy = Eagle(drafter, max_nodes=20, top_k=2, depth=depth, expand=20, stop_below=stop_below)
        strategy.bind(model, None)
        state = state_for(PROMPT, Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers))
        strategy.reset(state)
        calls.clear()
        tree = strategy.propose(state)
        return (tree.tokens.tolist(), tree.parents), len(calls)

    by_depth = {depth: propose(depth=depth) for depth in range(1, 5)}
    assert [n for _, n in by_depth.values()] == [1, 2, 3, 4]     # one drafter forward per level
    levels_used = []
    for stop_below in [0.0] + [10 ** (-k / 4) for k in range(24, -1, -1)]:     # 1e-6 ... 1
        tree, n_calls = propose(stop_below=stop_below)
        assert tree == by_depth[n_calls][0]
        assert not levels_used or n_calls <= levels_used[-1]
        levels_used.append(n_calls)
    assert levels_used[0] == 4 and levels_used[-1] == 1
    assert any(1 < n < 4 for n in levels_used)                   # a stop between the first and last level
    with pytest.raises(ConfigError, match="stop_below"):
        Eagle(drafter, stop_below=1.5)
    run(model, Eagle(drafter, max_nodes=12, top_k=3, depth=4, stop_below=0.3))    # greedy identity


@pytest.mark.parametrize("sampled,parents_shape", [
    (dict(), (-1, 0, 1, 2)),                                          # the default: a sampled chain of 4
    (dict(sampled_top_k=2, sampled_depth=2), "two levels of two"),
    (dict(sampled_top_k=None, sampled_depth=None), "top_k / depth"),
])
def test_sampled_trees_take_their_own_width_and_depth(sampled, parents_shape):
    model = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = Eagle(random_drafter(model), max_nodes=8, top_k=3, depth=4, **sampled)
    strategy.bind(model, None)
    state = state_for(PROMPT, Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers), temperature=0.9)
    strategy.reset(state)
    tree = strategy.propose(state)
    assert tree.draft_probs is not None                      # real distributions, not point masses
    depths = tree.depths()
    if parents_shape == "two levels of two":
        assert tree.num_nodes == 4 and depths.count(0) == 2 and depths.count(1) == 2
    elif parents_shape == "top_k / depth":
        assert depths.count(0) == 3 and max(depths) >= 2 and tree.num_nodes == 8
    else:
        assert tree.parents == parents_shape


def test_a_temperature_takes_sampled_depth_levels_under_either_sampler():
    """eagle.depth bounds greedy trees only (the table chain continues them); at a temperature the rejection
    sampler's tree and the coupled sampler's best-first tree both take sampled_depth levels."""
    from specdec.coupled import GumbelNoise
    model = tiny_model("llama", seed=1, sharpen=4.0)
    strategy = Eagle(random_drafter(model), max_nodes=8, top_k=2, depth=1, sampled_top_k=1, sampled_depth=3,
                     stop_below=0.0, expand=8, table_chain=0)
    strategy.bind(model, None)
    hidden = Verifier(model).prefill(PROMPT[:-1], strategy.feature_layers)

    def tree_at(temperature: float, coupled: bool = False):
        state = state_for(PROMPT, hidden, temperature=temperature)
        if coupled:
            state.noise = GumbelNoise(0, state.sampling, strategy.vocab)
        strategy.reset(state)
        return strategy.propose(state)

    greedy = tree_at(0.0)
    assert greedy.num_nodes == 2 and max(greedy.depths()) == 0          # one level: the root's top_k
    rejection = tree_at(0.9)
    assert rejection.draft_probs is not None and rejection.parents == (-1, 0, 1)
    coupled = tree_at(0.9, coupled=True)
    assert coupled.draft_probs is None and max(coupled.depths()) == 2 and coupled.num_nodes == 8


def test_drafter_dtype_is_the_targets_a_named_one_or_measured(monkeypatch):
    from specdec.heads import eagle_io
    model = tiny_model("llama", seed=1)
    drafter = random_drafter(model)
    assert eagle_io.drafter_dtype(None, model, drafter) == torch.float32
    assert eagle_io.drafter_dtype("bfloat16", model, drafter) == torch.bfloat16
    assert eagle_io.drafter_dtype(torch.float16, model, drafter) == torch.float16
    monkeypatch.setattr(eagle_io, "has_native_bf16", lambda device: device.type == "cpu")
    # float32 takes 2 s, bfloat16 the first figure, int8 weights the second
    for bf16_seconds, int8_seconds, expected in ((1.0, 1.0, torch.bfloat16), (2.5, 1.0, torch.float32),
                                                 (1.0, 0.5, "int8")):
        monkeypatch.setattr(eagle_io, "_CPU_DTYPE", {})
        monkeypatch.setattr(eagle_io, "_tree_level_seconds", lambda d, t, dtype, b=bf16_seconds, i=int8_seconds:
                            {torch.float32: 2.0, torch.bfloat16: b, "int8": i}[dtype])
        assert eagle_io.drafter_dtype("auto", model, drafter) == expected
    monkeypatch.setattr(eagle_io, "int8_supported", lambda device: False)      # no int8 kernel: bfloat16 at best
    monkeypatch.setattr(eagle_io, "_CPU_DTYPE", {})
    assert eagle_io.drafter_dtype("auto", model, drafter) == torch.bfloat16
    with pytest.raises(ConfigError, match="eagle.dtype: int8"):
        eagle_io.drafter_dtype("int8", model, drafter)
    assert eagle_io.drafter_dtype("auto", model.to(torch.bfloat16), drafter) == torch.bfloat16   # not fp32: kept
    model.to(torch.float32)
    # a CPU that emulates bf16: float32, whatever a (loaded machine's) timing would say
    monkeypatch.setattr(eagle_io, "has_native_bf16", lambda device: False)
    monkeypatch.setattr(eagle_io, "_CPU_DTYPE", {})
    assert eagle_io.drafter_dtype("auto", model, drafter) == torch.float32
    # the measurement itself: a positive time, on a copy (the drafter keeps its dtype)
    monkeypatch.undo()
    assert eagle_io._tree_level_seconds(drafter, model, torch.bfloat16, repeats=1) > 0
    if int8_supported(torch.device("cpu")):
        assert eagle_io._tree_level_seconds(drafter, model, "int8", repeats=1) > 0
    assert next(drafter.parameters()).dtype == torch.float32


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_bfloat16_drafter_beside_a_float32_target_keeps_greedy_identity(arch):
    """Only the drafts change: the target verifies in float32. The drafter reads a bf16 copy of the
    target's lm_head; the target's own stays float32 and the saved drafter holds no lm_head."""
    model = biased_target(arch, 3.0)
    head_before = model.get_output_embeddings().weight.detach().clone()
    strategy = Eagle(echo_drafter(model), max_nodes=6, top_k=2, depth=4, dtype="bfloat16")
    accepted = run(model, strategy)
    assert sum(accepted) > 0                                   # the bf16 drafts are accepted
    assert next(strategy.drafter.parameters()).dtype == torch.bfloat16
    assert strategy.drafter.logits(torch.zeros(1, model.config.hidden_size, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert model.get_output_embeddings().weight.dtype == torch.float32
    assert torch.equal(model.get_output_embeddings().weight, head_before)
    assert not any("lm_head" in name for name in strategy.drafter.state_dict())


@pytest.mark.skipif(not int8_supported(torch.device("cpu")), reason="this torch has no CPU int8 weight kernel")
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_an_int8_drafter_keeps_greedy_identity_and_leaves_the_target_as_it_was(arch):
    """int8 weights (specdec/int8_linear.py) change only what is drafted: every linear layer of the drafter,
    and its copy of the target's lm_head, hold int8 weights; the target's own lm_head is untouched."""
    model = biased_target(arch, 3.0)
    head_before = model.get_output_embeddings().weight.detach().clone()
    strategy = Eagle(echo_drafter(model), max_nodes=6, top_k=2, depth=4, dtype="int8")
    accepted = run(model, strategy)
    assert sum(accepted) > 0                                   # the int8 drafts are accepted
    linears = [m for m in strategy.drafter.modules() if isinstance(m, (nn.Linear, Int8Linear))]
    assert linears and all(isinstance(m, Int8Linear) for m in linears if m.in_features % 32 == 0)
    assert isinstance(strategy.drafter._shared_lm_head[0], Int8Linear) == (model.config.hidden_size % 32 == 0)
    assert torch.equal(model.get_output_embeddings().weight, head_before)


def test_score_temperature_must_be_positive():
    model = tiny_model("llama", seed=1)
    with pytest.raises(ConfigError, match="score_temperature"):
        Eagle(random_drafter(model), score_temperature=0.0)
