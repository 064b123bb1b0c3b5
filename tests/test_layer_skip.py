"""layer_skip: the target drafts with itself minus a set of skipped attention / MLP sublayers.

* the view: it shares the target's modules (no weight copied), leaves the target untouched, and computes
  what the target computes with those sublayers' outputs silenced, with and without a cache (a skipped
  layer-0 attention included: positions come from layer 0's cache length);
* greedy identity to Hugging Face generate(do_sample=False), chains and trees, explicit sets and auto, on
  every identity architecture (tests/conftest.py), one sequence and a ragged batch; skipping sublayers that
  add nothing accepts every drafted token;
* no draft KV reaches the verify: a draft cache poisoned with NaN after every proposal still gives identity;
* the exact output law (rejection sampler) and the coupled sampler's same-seed-same-text, with negative
  controls;
* SWIFT's choice: on a history one set drafted itself, it picks that set, and every set's score is the
  brute-force count of its right guesses;
* refusals: layers out of range, a set skipping everything or nothing, an architecture whose layers or
  sublayers cannot be run apart.
"""
from __future__ import annotations

import copy
import random
from functools import lru_cache
from unittest import mock

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, tiny_model
from self_draft import (LAW_CASES, check_a_lying_drafter_breaks_the_law, check_always_accept_breaks_the_law,
                        check_coupled_reproduces_autoregressive, check_hooks_stay_apart, check_output_law,
                        check_the_rejection_sampler_gives_other_texts, lying)
from specdec import Speculator
from specdec.cache import new_cache
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.models import cache_kwargs
from specdec.strategies.layer_skip import (ATTENTION, MLP, LayerSkip, Skipper, choose, neighbours, skip_set,
                                           start_set)

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]
SHAPES = {"chain": dict(num_tokens=4), "tree": dict(branching=[2, 2, 1])}
# layer 0's attention skipped: the case where Hugging Face's positions (layer 0's cache length) could shift
SETS = {"attention 0": dict(attention=[0]), "attention 0, 2 + mlp 1": dict(attention=[0, 2], mlp=[1])}


@lru_cache(maxsize=None)
def target_of(arch: str, layers: int = 3):
    return tiny_model(arch, seed=0, layers=layers, sharpen=3.0)


def silenced(model, attention=(), mlp=()):
    """A copy of a llama whose listed sublayers add nothing to the residual stream (their output
    projections zero): what a view skipping them must compute."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for i in attention:
            model.model.layers[i].self_attn.o_proj.weight.zero_()
        for i in mlp:
            model.model.layers[i].mlp.down_proj.weight.zero_()
    return model


@torch.inference_mode()
def one_by_one(model, ids: list[int]) -> torch.Tensor:
    """[T, V] the model's logits over `ids` fed one token per forward through a specdec cache."""
    cache = new_cache(model)
    return torch.cat([model(input_ids=torch.tensor([[token]]), use_cache=True, **cache_kwargs(model, cache)).logits[0]
                      for token in ids])


# ---------------------------------------------------------------------- the view
def test_the_view_shares_the_targets_modules_and_leaves_it_alone():
    target = target_of("llama", 4)
    before = {name: p.data_ptr() for name, p in target.named_parameters()}
    modules = dict(target.named_modules())
    view = Skipper(target).view(skip_set(attention=[0], mlp=[2]))
    assert dict(target.named_modules()) == modules                   # the same modules, none replaced
    assert type(target.model.layers[0].self_attn).__name__ == "LlamaAttention"
    assert view.model.layers[1] is target.model.layers[1]            # untouched layers are the target's own
    assert view.model.layers[0] is not target.model.layers[0]
    assert view.model.layers[0].mlp is target.model.layers[0].mlp    # ... a touched one shares what it runs
    assert view.lm_head is target.lm_head and view.model.norm is target.model.norm
    assert {p.data_ptr() for p in view.parameters()} <= set(before.values())      # nothing copied
    assert {name: p.data_ptr() for name, p in target.named_parameters()} == before
    check_hooks_stay_apart(view, target, PROMPT)


@pytest.mark.parametrize("name", list(SETS))
def test_the_view_is_the_target_with_those_sublayers_silenced(name):
    target = target_of("llama", 3)
    view = Skipper(target).view(skip_set(**SETS[name]))
    reference = silenced(target, **SETS[name])
    ids = PROMPT + [3, 8, 13]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(view(torch.tensor([ids])).logits[0], expected)
    # through a cache, a token at a time: every position right, so every layer's cache kept its length
    torch.testing.assert_close(one_by_one(view, ids), expected)
    assert not torch.allclose(expected, target(torch.tensor([ids])).logits[0].detach())


# ---------------------------------------------------------------------- greedy identity
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(SETS))
def test_greedy_identity(arch, shape, name):
    target = target_of(arch)
    out = Speculator(target, None, LayerSkip(**SETS[name], **SHAPES[shape])).generate(PROMPT, max_new_tokens=N,
                                                                                       ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert out.stats.proposed_nodes > 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_identity_with_auto(arch, shape):
    target = target_of(arch)
    strategy = LayerSkip(auto=True, every=3, candidates=3, window=8, context=4, **SHAPES[shape])
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_skipping_sublayers_that_add_nothing_accepts_every_drafted_token(shape):
    target = silenced(target_of("llama"), attention=[0], mlp=[1, 2])
    strategy = LayerSkip(attention=[0], mlp=[1, 2], **SHAPES[shape])
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert sum(out.stats.accepted_lengths) == N - out.stats.target_forwards      # every step took its whole path


def test_partly_accepted_on_a_random_target():
    out = Speculator(target_of("llama"), None, LayerSkip(attention=[0], num_tokens=4)).generate(
        PROMPT, max_new_tokens=N, ignore_eos=True)
    assert 0 < sum(out.stats.accepted_lengths) < out.stats.proposed_nodes


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("settings", [dict(attention=[0], mlp=[1]), dict(auto=True, every=2, window=6)])
def test_ragged_batch(arch, shape, settings):
    target = target_of(arch)
    tokenizer = char_tokenizer()
    prompts = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "ab"]
    lengths = [20, 7, 30, 12]
    sd = Speculator(target, tokenizer, LayerSkip(**settings, **SHAPES[shape]))
    outs = sd.generate(prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(prompts, outs, lengths):
        assert out.token_ids == hf_greedy(target, tokenizer(prompt)["input_ids"], n, eos_token_id=None)


def test_reusable_across_calls_and_the_target_untouched():
    target = target_of("llama", 4)
    state = {name: p.clone() for name, p in target.state_dict().items()}
    strategy = LayerSkip(auto=True, adaptive=True, every=2)
    sd = Speculator(target, None, strategy)
    assert 0 < strategy.draft_cost < 1
    for prompt in (PROMPT, PROMPT[::-1], PROMPT):
        assert sd.generate(prompt, max_new_tokens=12, ignore_eos=True).token_ids == \
            hf_greedy(target, prompt, 12, eos_token_id=None)
    assert all(torch.equal(p, state[name]) for name, p in target.state_dict().items())
    assert target.config.num_hidden_layers == 4
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in target.modules())


# ---------------------------------------------------------------------- no draft KV reaches the verify
@torch.inference_mode()
def poison(cache) -> int:
    """Fill every KV buffer of a cache with NaN; how many buffers it filled."""
    filled = 0
    for layer in cache.layers:
        for name in ("kv_buffer", "key_buffer", "value_buffer"):
            buffer = getattr(layer, name, None)
            if buffer is not None:
                buffer.fill_(float("nan"))
                filled += 1
    return filled


class Poisoned(LayerSkip):
    """Fills the draft's KV with NaN after every proposal: a verify that read any of it would go wrong."""
    filled = 0

    def propose(self, state):
        tree = super().propose(state)
        Poisoned.filled += poison(self.cache if self.batch is None else self.batch.rows.cache)
        return tree

    @staticmethod
    def propose_many(drafters, states, batch):
        trees = LayerSkip.propose_many(drafters, states, batch)
        Poisoned.filled += poison(batch.rows.cache)
        return trees


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_poisoned_draft_cache_still_gives_identity(arch, shape):
    target = target_of(arch)
    settings = dict(attention=[0], mlp=[1], **SHAPES[shape])
    clean = Speculator(target, None, LayerSkip(**settings)).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    Poisoned.filled = 0
    out = Speculator(target, None, Poisoned(**settings)).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert Poisoned.filled > 0
    # the poison reached the drafts (they changed), never the output
    assert out.stats.accepted_lengths != clean.stats.accepted_lengths or \
        out.stats.proposed_nodes != clean.stats.proposed_nodes


def test_a_poisoned_draft_cache_still_gives_identity_in_a_batch():
    target = target_of("llama")
    tokenizer = char_tokenizer()
    prompts = ["def parse(text):\n    return text", "class Foo:", "ab"]
    Poisoned.filled = 0
    outs = Speculator(target, tokenizer, Poisoned(attention=[0], num_tokens=3)).generate(
        prompts, max_new_tokens=16, ignore_eos=True)
    assert Poisoned.filled > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(target, tokenizer(prompt)["input_ids"], 16, eos_token_id=None)


# ---------------------------------------------------------------------- SWIFT's choice
def greedy_continuation(model, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy continuation, by full forwards (no cache)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def brute_force_hits(model, ids: list[int], window: int) -> int:
    """Right greedy guesses of the model at each of the last `window` tokens, one full forward per guess."""
    with torch.no_grad():
        return sum(int(model(torch.tensor([ids[:t]])).logits[0, -1].argmax()) == ids[t]
                   for t in range(len(ids) - window, len(ids)))


@pytest.mark.parametrize("drafting", [1, 3])
def test_the_choice_picks_the_set_that_drafted_the_history_and_counts_like_brute_force(drafting):
    target = target_of("llama", 4)
    skipper = Skipper(target)
    rng = random.Random(drafting)
    sets = [frozenset(rng.sample(skipper.sublayers(), 3)) for _ in range(5)]
    views = [skipper.view(s) for s in sets]
    history = greedy_continuation(views[drafting], PROMPT, 16)          # what set `drafting` drafts itself
    best, hits = choose(views, history, window=16, context=len(history))
    assert hits == [brute_force_hits(view, history, 16) for view in views]
    assert hits[drafting] == 16
    assert best == hits.index(max(hits)) and hits[best] == 16
    assert min(hits) < 16                            # the history does tell the sets apart


def test_the_choice_reads_only_its_window_and_context():
    target = target_of("llama", 4)
    view = Skipper(target).view(skip_set(attention=[1]))
    history = greedy_continuation(view, PROMPT, 12)
    changed = [(token + 1) % 90 for token in history[:4]] + history[4:]   # tokens before window + context
    assert choose([view], history, window=6, context=3)[1] == choose([view], changed, window=6, context=3)[1]


def test_neighbours_swap_one_sublayer_each():
    skipper = Skipper(target_of("llama", 4))
    current = start_set(skipper.sublayers(), 4, 0.25)
    assert len(current) == 2 and (MLP, 2) in current and (ATTENTION, 2) in current
    found = neighbours(current, skipper.sublayers(), 5, random.Random(0))
    assert len(found) == len(set(found)) == 5
    for other in found:
        assert len(other) == len(current) and len(other - current) == 1 and set(other) <= set(skipper.sublayers())


def test_auto_moves_to_a_better_set():
    """Start from a set that drafts badly; the target's upper sublayers add nothing, so skipping them drafts
    perfectly: the search finds such a set and acceptance is whole from then on."""
    target = silenced(target_of("llama", 4), attention=[3], mlp=[2, 3])
    strategy = LayerSkip(attention=[0], mlp=[0], auto=True, every=2, candidates=30, window=8)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert strategy.skipped <= skip_set(attention=[3], mlp=[2, 3]) and len(strategy.skipped) == 2
    assert strategy.skipped != strategy.start


# ---------------------------------------------------------------------- refusals
def test_no_set_is_refused():
    with pytest.raises(ConfigError, match="no sublayer to skip"):
        LayerSkip()


@pytest.mark.parametrize("settings", [dict(attention=[3]), dict(mlp=[0, 7])])
def test_a_layer_out_of_range_is_refused(settings):
    with pytest.raises(ConfigError, match=r"outside 0 \.\. 2 \(the target has 3 decoder layers\)"):
        Speculator(target_of("llama"), None, LayerSkip(**settings))


def test_a_set_that_skips_everything_is_refused():
    with pytest.raises(ConfigError, match="skips every sublayer"):
        Speculator(target_of("llama"), None, LayerSkip(attention=[0, 1, 2], mlp=[0, 1, 2]))


def test_the_config_refuses_a_bad_fraction_and_negative_layers():
    from specdec.config import load_spec_config
    with pytest.raises(ConfigError, match="skip_fraction"):
        load_spec_config("layer_skip", ["layer_skip.skip_fraction=0"])
    with pytest.raises(ConfigError, match="attention"):
        load_spec_config("layer_skip", ["layer_skip.attention=[-1]"])


def test_a_model_with_no_single_list_of_its_layers_is_refused():
    target = copy.deepcopy(target_of("llama"))
    target.model.mirror = torch.nn.ModuleList(list(target.model.layers))
    with pytest.raises(IncompatibleModelsError, match="layer_skip: .*cannot be run apart"):
        Speculator(target, None, LayerSkip(attention=[0]))


def test_a_layer_without_that_sublayer_is_refused():
    """A layer whose MLP goes by a name the skipper does not know cannot have it skipped (its attention still can)."""
    from specdec.strategies import layer_skip
    with mock.patch.dict(layer_skip.CHILD_NAMES, {MLP: ("ffn",)}):
        with pytest.raises(IncompatibleModelsError, match=r"decoder layer 1 .* has no mlp child \(its children: .*mlp"):
            Speculator(target_of("llama"), None, LayerSkip(mlp=[1]))
        assert Speculator(target_of("llama"), None, LayerSkip(attention=[1])).generate(
            PROMPT, max_new_tokens=8, ignore_eos=True).token_ids == hf_greedy(target_of("llama"), PROMPT, 8,
                                                                              eos_token_id=None)


def test_a_forward_that_runs_a_skipped_sublayer_is_refused():
    """The probe: a view whose decoder still calls the real module (here the skipped MLP's forward is
    routed back to it) is refused, naming what ran."""
    target = target_of("llama")
    skipper = Skipper(target)
    real = target.model.layers[1].mlp
    with mock.patch("specdec.strategies.layer_skip.SkippedMLP.forward", lambda self, hidden, *a, **k: real(hidden)):
        with pytest.raises(IncompatibleModelsError, match=r"ran .*\('mlp', 1\)"):
            skipper.view(skip_set(mlp=[1]))


# ---------------------------------------------------------------------- the law
@pytest.mark.parametrize("shape, params", LAW_CASES)
def test_output_law_is_the_targets(shape, params):
    check_output_law(LayerSkip(attention=[0], mlp=[1], **shape), params)


def test_negative_control_always_accept():
    check_always_accept_breaks_the_law(LayerSkip(attention=[0], mlp=[1], num_tokens=2))


def test_negative_control_a_drafter_that_lies_about_its_distribution():
    check_a_lying_drafter_breaks_the_law(lying(LayerSkip)(attention=[0], mlp=[1], num_tokens=2))


# ---------------------------------------------------------------------- the coupled sampler
@pytest.mark.parametrize("shape", list(SHAPES))
def test_coupled_reproduces_autoregressive(arch, shape):
    check_coupled_reproduces_autoregressive(target_of(arch), lambda: LayerSkip(attention=[0], mlp=[1], **SHAPES[shape]),
                                            PROMPT, N)


def test_negative_control_the_rejection_sampler_gives_other_texts():
    check_the_rejection_sampler_gives_other_texts(target_of("llama"), lambda: LayerSkip(attention=[0], num_tokens=4),
                                                  PROMPT, N)


# ---------------------------------------------------------------------- in auto's menu
def test_auto_runs_layer_skip_as_its_drafter():
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    target = target_of("llama")
    cfg = load_spec_config("auto", ["auto.drafter=layer_skip", "layer_skip.attention=[0]", "layer_skip.mlp=[2]",
                                    "layer_skip.auto=false", "auto.profile=false"])
    strategy = build_strategy(cfg, target, None, target.device, target.dtype)
    assert isinstance(strategy.drafter, LayerSkip) and strategy.drafter.start == skip_set(attention=[0], mlp=[2])
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)


def test_auto_proposes_nothing_from_layer_skip_where_nodes_cost_a_whole_step():
    """auto prices layer_skip as every drafter: where a node costs as much as a plain step, nothing pays."""
    from specdec.costmodel import CostProfile
    from specdec.strategies.auto import Auto
    from specdec.strategies.prompt_lookup import PromptLookup
    costly = CostProfile((0, 1), (1.0, 2.0), 0, "costly")
    strategy = Auto(PromptLookup(), LayerSkip(auto=True, every=2), costs=costly, adapt_costs=False, draft_cost_s=0.0)
    target = target_of("llama")
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert strategy.tree_sizes == [0] * N and out.stats.tokens_per_forward == 1.0
