"""Greedy identity: every strategy's output equals Hugging Face generate(do_sample=False), token
for token, on tiny random models of several architectures, whatever the draft's quality.

References:
* ignore_eos=True is compared with HF greedy told there is no EOS (eos_token_id=None): both run
  on past an EOS token. (min_new_tokens=n would instead *suppress* EOS, another distribution.)
* EOS allowed is compared with HF greedy's own default stopping.
"""
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch

from conftest import hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel


N = 24
PROMPT = [5, 17, 33, 9, 41, 60, 70]
EOS = 2
GAMMA = 4
BRANCHING = [2, 2, 1]


# ---------------------------------------------------------------------- models
@lru_cache(maxsize=None)
def target_of(arch: str):
    return tiny_model(arch, seed=0)



def contrarian_copy(model):
    """The model with its output layer negated (untied from the input embeddings): its top-k
    tokens are the target's bottom-k, so it never proposes the target's argmax."""
    draft = copy.deepcopy(model)
    head = draft.get_output_embeddings()
    with torch.no_grad():
        head.weight = torch.nn.Parameter(-head.weight.detach().clone())
        if getattr(head, "bias", None) is not None:
            head.bias = torch.nn.Parameter(-head.bias.detach().clone())
    return draft


def with_eos_at(model, prompt: list[int], at_least: int, n: int = N):
    """A copy of `model` whose greedy continuation of `prompt` is the plain one up to position
    `at` (the first position >= at_least holding a token not seen before in the continuation),
    then EOS: the EOS row of the output layer becomes the row of the token greedy picks there,
    nudged along that position's hidden state so that EOS wins by a small margin.
    Returns (model, at, plain continuation), or None when the continuation has no such position."""
    plain = hf_greedy(model, prompt, n, eos_token_id=None)
    fresh = [k for k in range(at_least, n) if plain[k] not in plain[:k] and plain[k] != EOS and EOS not in plain[:k]]
    if not fresh:
        return None
    at = fresh[0]
    model = copy.deepcopy(model)
    with torch.no_grad():
        out = model(torch.tensor([prompt + plain[:at]]), output_hidden_states=True)
        hidden = out.hidden_states[-1][0, -1]                               # [H]
        head = model.get_output_embeddings()
        row = head.weight[plain[at]].clone() + 1e-3 * hidden / hidden.norm() ** 2
        head.weight = torch.nn.Parameter(head.weight.detach().clone())     # untie before editing
        head.weight[EOS] = row
        if getattr(head, "bias", None) is not None:
            head.bias[EOS] = head.bias[plain[at]]
    return model, at, plain


@lru_cache(maxsize=None)
def _reference(arch: str, n: int) -> tuple[int, ...]:
    return tuple(hf_greedy(target_of(arch), PROMPT, n, eos_token_id=None))


def reference(arch: str, n: int = N) -> list[int]:
    return list(_reference(arch, n))



def chain_or_tree(draft, shape: str, **kwargs) -> DraftModel:
    if shape == "chain":
        return DraftModel(draft, num_tokens=GAMMA, **kwargs)
    return DraftModel(draft, branching=BRANCHING, **kwargs)


def depth_of(shape: str) -> int:
    return GAMMA if shape == "chain" else len(BRANCHING)


def full_acceptance_schedule(depth: int, n: int) -> list[int]:
    """Accepted lengths per step when every drafted token is accepted (the loop prunes the tree
    to the budget left: max_new_tokens - generated - 1)."""
    steps, generated = [], 0
    while generated < n:
        accepted = min(depth, n - generated - 1)
        steps.append(accepted)
        generated += accepted + 1
    return steps


# ---------------------------------------------------------------------- tests
def test_autoregressive_equals_hf_greedy(arch):
    target = target_of(arch)
    out = Speculator(target, None, Autoregressive()).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference(arch)
    assert out.stats.target_forwards == N
    assert out.stats.tokens_per_forward == 1.0
    assert out.finish_reason == "length"


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_all_accepted_draft(arch, shape):
    target = target_of(arch)
    out = Speculator(target, None, chain_or_tree(target, shape)).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference(arch)
    expected = full_acceptance_schedule(depth_of(shape), N)
    assert out.stats.accepted_lengths == expected
    assert out.stats.target_forwards == len(expected)
    assert out.stats.tokens_per_forward == pytest.approx(N / len(expected))
    assert out.stats.tokens_per_forward > depth_of(shape)        # close to depth + 1


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_none_accepted_draft(arch, shape):
    target = target_of(arch)
    strategy = chain_or_tree(contrarian_copy(target), shape)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference(arch)
    assert out.stats.accepted_lengths == [0] * N
    assert out.stats.proposed_nodes > 0                          # it did propose, every time
    assert out.stats.tokens_per_forward == 1.0


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_partially_accepted_draft(arch, shape):
    target = target_of(arch)
    strategy = chain_or_tree(noisy_copy(target), shape)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference(arch)
    accepted = out.stats.accepted_lengths
    assert sum(accepted) > 0, "the noisy draft should agree with the target sometimes"
    assert accepted != full_acceptance_schedule(depth_of(shape), N), "the noisy draft should miss sometimes"
    assert 1.0 < out.stats.tokens_per_forward < depth_of(shape) + 1


@pytest.mark.parametrize("strategy_kind", ["autoregressive", "chain", "tree"])
def test_eos_stops_like_hf(arch, strategy_kind):
    for prompt in (PROMPT, PROMPT[:5], PROMPT[::-1], [3, 4, 5]):
        made = with_eos_at(target_of(arch), prompt, at_least=6)
        if made is not None:
            break
    assert made is not None, "precondition: a prompt whose continuation can be made to end in EOS"
    target, at, plain = made
    expected = hf_greedy(target, prompt, N)                      # HF's default stopping at EOS
    assert expected == plain[:at] + [EOS], "precondition: greedy hits EOS at `at`"
    if strategy_kind == "autoregressive":
        strategy = Autoregressive()
    else:   # draft = target: the EOS falls inside a long accepted run
        strategy = chain_or_tree(target, strategy_kind)
    out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=N)
    assert out.token_ids == expected
    assert out.finish_reason == "eos"
    assert out.stats.new_tokens == len(expected)


@pytest.mark.parametrize("draft_kind", ["same", "noisy"])
def test_adaptive_gamma(arch, draft_kind):
    target = target_of(arch)
    draft = target if draft_kind == "same" else noisy_copy(target)
    strategy = DraftModel(draft, num_tokens=2, adaptive=True, min_tokens=1, max_tokens=8)
    out = Speculator(target, None, strategy).generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.token_ids == reference(arch)
    if draft_kind == "same":     # everything accepted: gamma grows past its start value
        assert max(out.stats.accepted_lengths) > 2
        assert out.stats.proposed_nodes == sum(out.stats.accepted_lengths)


def test_speculator_reusable_across_calls(arch):
    """Several generate calls on one Speculator (draft cache reset between calls) stay exact."""
    target = target_of(arch)
    sd = Speculator(target, None, chain_or_tree(noisy_copy(target), "chain"))
    first = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids
    other_prompt = PROMPT[::-1]
    second = sd.generate(other_prompt, max_new_tokens=12, ignore_eos=True).token_ids
    third = sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids
    assert first == third == reference(arch)
    assert second == hf_greedy(target, other_prompt, 12, eos_token_id=None)


# ---------------------------------------------------------------------- long context: cache growth
LONG_PROMPT = torch.randint(3, 96, (300,), generator=torch.Generator().manual_seed(11)).tolist()
LONG_NEW = 264      # 299 prefilled + 256 spare slots = 555: the buffers must grow past that


@lru_cache(maxsize=None)
def long_target():
    """A tiny llama with room for 300 + LONG_NEW positions."""
    from conftest import tiny_config
    import transformers as T
    config = tiny_config("llama")
    config.max_position_embeddings = 1024
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config).eval()


@lru_cache(maxsize=None)
def long_reference() -> tuple[int, ...]:
    return tuple(hf_greedy(long_target(), LONG_PROMPT, LONG_NEW, eos_token_id=None))


def capacity(layer) -> int | None:
    buffer = getattr(layer, "key_buffer", None)
    return None if buffer is None else buffer.shape[2]


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_long_context_sizes_the_target_cache_once_and_grows_the_drafts(shape, monkeypatch):
    """A 300-token prompt and 264 new tokens. The target's KV buffers are sized once for prompt +
    max_new_tokens + the largest forward (the Speculator tells the verifier): no reallocation
    mid-call. The draft's cache is told no capacity (BufferedLayer's fallback: 256 spare slots
    after the prefill), so it must grow by reallocating mid-call. Output equals HF greedy."""
    from specdec.cache import BufferedLayer
    grown: set[int] = set()          # id() of layers whose existing buffer was reallocated larger
    updated: set[int] = set()
    update = BufferedLayer.update

    def recording_update(self, *args, **kwargs):
        before = capacity(self)
        out = update(self, *args, **kwargs)
        updated.add(id(self))
        if before is not None and capacity(self) > before:
            grown.add(id(self))
        return out

    monkeypatch.setattr(BufferedLayer, "update", recording_update)
    target = long_target()
    strategy = chain_or_tree(noisy_copy(target), shape)
    sd = Speculator(target, None, strategy)
    out = sd.generate(LONG_PROMPT, max_new_tokens=LONG_NEW, ignore_eos=True)
    assert out.token_ids == list(long_reference())
    assert 0 < sum(out.stats.accepted_lengths) < LONG_NEW, "precondition: partial acceptance"
    target_layers = {id(layer) for layer in sd.verifier.cache.layers}
    draft_layers = {id(layer) for layer in strategy.cache.layers}
    assert target_layers <= updated, "precondition: the target's layers were written"
    assert not target_layers & grown, "the target's cache was reallocated although its capacity was given"
    assert all(layer.reallocations == 0 for layer in sd.verifier.cache.layers)
    assert all(capacity(layer) >= len(LONG_PROMPT) + LONG_NEW for layer in sd.verifier.cache.layers)
    assert draft_layers & grown, "the draft's cache buffer never grew (the fallback without a capacity)"
    assert any(layer.reallocations > 0 for layer in strategy.cache.layers)
