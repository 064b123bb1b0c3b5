"""early_exit: the target drafts with its own first E layers, its final norm and its lm_head.

* the view: it shares the target's modules (no weight copied), runs exactly layers 0 .. E - 1 and
  leaves the target untouched (its config, its hooks, its forward);
* greedy identity to Hugging Face generate(do_sample=False), chains (reusing the target's KV, the
  default, and not) and trees, on every identity architecture (tests/conftest.py), one sequence and a
  ragged batch (whose rows draft on caches of their own); a target whose upper layers add nothing
  accepts every drafted token;
* the exact output law (rejection sampler) and the coupled sampler's same-seed-same-text, with
  negative controls (chains reusing the target's KV, as by default);
* refusals: E outside 1 .. L - 1, an architecture whose layers cannot be run apart.
Parity with Hugging Face's own `generate(assistant_early_exit=E)` is tests/test_early_exit_hf.py; the KV
reuse's own checks (the cache after each step, nothing run twice) are tests/test_early_exit_reuse.py.
"""
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch

from conftest import char_tokenizer, hf_greedy, tiny_model
from self_draft import (LAW_CASES, TOP2, check_a_lying_drafter_breaks_the_law, check_always_accept_breaks_the_law,
                        check_coupled_reproduces_autoregressive, check_hooks_stay_apart, check_output_law,
                        check_the_rejection_sampler_gives_other_texts, lying)
from specdec import Speculator
from specdec.errors import ConfigError, IncompatibleModelsError
from specdec.strategies.early_exit import EarlyExit, _check_runs_its_layers, exit_view

N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]
SHAPES = {"chain": dict(num_tokens=4), "tree": dict(branching=[2, 2, 1])}


@lru_cache(maxsize=None)
def target_of(arch: str, layers: int = 3):
    return tiny_model(arch, seed=0, layers=layers, sharpen=3.0)


def upper_layers_silenced(model, exit_layer: int):
    """A copy of a llama whose layers from `exit_layer` on add nothing to the residual stream (their
    output projections zero): its exit at `exit_layer` is the whole model."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in model.model.layers[exit_layer:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


# ---------------------------------------------------------------------- the view
def test_the_view_shares_the_targets_modules_and_leaves_it_alone():
    target = target_of("llama", 4)
    before = {name: p.data_ptr() for name, p in target.named_parameters()}
    view = exit_view(target, 2)
    assert target.config.num_hidden_layers == 4 and len(target.model.layers) == 4
    assert view.config.num_hidden_layers == 2 and len(view.model.layers) == 2
    assert all(a is b for a, b in zip(view.model.layers, target.model.layers[:2]))
    assert view.model.norm is target.model.norm and view.lm_head is target.lm_head
    assert view.model.embed_tokens is target.model.embed_tokens
    assert {name: p.data_ptr() for name, p in target.named_parameters()} == before
    shared = {p.data_ptr() for p in view.parameters()}
    assert shared <= set(before.values())           # nothing copied
    check_hooks_stay_apart(view, target, PROMPT)


def test_the_view_is_the_targets_first_layers_then_its_norm_and_head():
    target = target_of("llama", 4)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[2]            # after layer 2 (index 1)
        expected = target.lm_head(target.model.norm(hidden))
        got = exit_view(target, 2)(ids).logits
    torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------------- greedy identity
@pytest.mark.parametrize("shape, reuse_kv", [("chain", True), ("chain", False), ("tree", True)])
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_greedy_identity(arch, shape, reuse_kv, exit_layer):
    target = target_of(arch)
    strategy = EarlyExit(exit_layer, **SHAPES[shape], reuse_kv=reuse_kv)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert (strategy.split is not None) == (reuse_kv and shape == "chain")     # chains reuse the target's KV
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert out.stats.proposed_nodes > 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_upper_layers_that_add_nothing_accept_every_drafted_token(shape):
    target = upper_layers_silenced(target_of("llama"), 1)
    out = Speculator(target, None, EarlyExit(1, **SHAPES[shape])).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert sum(out.stats.accepted_lengths) == N - out.stats.target_forwards      # every step took its whole path


def test_partly_accepted_on_a_random_target():
    target = target_of("llama")
    out = Speculator(target, None, EarlyExit(2, num_tokens=4)).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert 0 < sum(out.stats.accepted_lengths) < out.stats.proposed_nodes


@pytest.mark.parametrize("shape", list(SHAPES))
def test_ragged_batch(arch, shape):
    target = target_of(arch)
    tokenizer = char_tokenizer()
    prompts = ["def parse(text):\n    return text", "class Foo:", "for i in range(10):\n    print(i)", "ab"]
    lengths = [20, 7, 30, 12]
    sd = Speculator(target, tokenizer, EarlyExit(1, **SHAPES[shape]))
    outs = sd.generate(prompts, max_new_tokens=lengths, ignore_eos=True, batch_size=3)
    for prompt, out, n in zip(prompts, outs, lengths):
        assert out.token_ids == hf_greedy(target, tokenizer(prompt)["input_ids"], n, eos_token_id=None)


def test_reusable_across_calls_and_draft_cost_from_the_layers():
    target = target_of("llama", 4)
    strategy = EarlyExit(1, adaptive=True)
    sd = Speculator(target, None, strategy)
    assert strategy.draft_cost == pytest.approx(1 / 4)
    for prompt in (PROMPT, PROMPT[::-1], PROMPT):
        assert sd.generate(prompt, max_new_tokens=12, ignore_eos=True).token_ids == \
            hf_greedy(target, prompt, 12, eos_token_id=None)


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize("exit_layer", [0, -1])
def test_an_exit_layer_below_one_is_refused(exit_layer):
    with pytest.raises(ConfigError, match="exit_layer must be >= 1"):
        EarlyExit(exit_layer)


@pytest.mark.parametrize("exit_layer", [3, 7])
def test_an_exit_layer_at_or_past_the_last_layer_is_refused(exit_layer):
    with pytest.raises(ConfigError, match=r"exit_layer must be in 1 \.\. 2 \(the target has 3 decoder layers"):
        Speculator(target_of("llama"), None, EarlyExit(exit_layer))


def test_the_config_refuses_an_exit_layer_below_one():
    from specdec.config import load_spec_config
    with pytest.raises(ConfigError, match="exit_layer"):
        load_spec_config("early_exit", ["early_exit.exit_layer=0"])


def test_a_model_with_no_single_list_of_its_layers_is_refused():
    target = copy.deepcopy(target_of("llama"))
    target.model.mirror = torch.nn.ModuleList(list(target.model.layers))     # two lists of its 3 layers
    with pytest.raises(IncompatibleModelsError, match="cannot be run apart"):
        Speculator(target, None, EarlyExit(1))


def test_a_forward_that_runs_every_layer_is_refused():
    """The probe: a 'view' whose forward runs all the target's layers (a decoder that reads its layers
    by a count of its own would) is refused, naming the layers it ran."""
    target = target_of("llama")
    with pytest.raises(IncompatibleModelsError, match=r"ran layers \[0, 1, 2\], not 0 \.\. 0"):
        _check_runs_its_layers(target, list(target.model.layers), 1)


# ---------------------------------------------------------------------- the law
@pytest.mark.parametrize("shape, params", LAW_CASES + [(dict(num_tokens=2, reuse_kv=False), TOP2)])
def test_output_law_is_the_targets(shape, params):
    check_output_law(EarlyExit(1, **shape), params)


def test_negative_control_always_accept():
    check_always_accept_breaks_the_law(EarlyExit(1, num_tokens=2))


def test_negative_control_a_drafter_that_lies_about_its_distribution():
    check_a_lying_drafter_breaks_the_law(lying(EarlyExit)(1, num_tokens=2))


# ---------------------------------------------------------------------- the coupled sampler
@pytest.mark.parametrize("shape", list(SHAPES))
def test_coupled_reproduces_autoregressive(arch, shape):
    check_coupled_reproduces_autoregressive(target_of(arch), lambda: EarlyExit(1, **SHAPES[shape]), PROMPT, N)


def test_negative_control_the_rejection_sampler_gives_other_texts():
    check_the_rejection_sampler_gives_other_texts(target_of("llama"), lambda: EarlyExit(1, num_tokens=4), PROMPT, N)


# ---------------------------------------------------------------------- in auto's menu
def test_auto_runs_early_exit_as_its_drafter():
    from specdec.config import load_spec_config
    from specdec.strategies import build_strategy
    target = target_of("llama")
    cfg = load_spec_config("auto", ["auto.drafter=early_exit", "early_exit.exit_layer=2", "auto.profile=false"])
    strategy = build_strategy(cfg, target, None, target.device, target.dtype)
    assert isinstance(strategy.drafter, EarlyExit) and strategy.drafter.exit_layer == 2
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == hf_greedy(target, PROMPT, N, eos_token_id=None)
