"""A target with linear-attention layers (Qwen3-Next: gated delta rule layers beside full attention),
verified on chains: the recurrent state is kept from before each forward and, where drafts are
rejected, put back and advanced over the kept tokens again (specdec.verifier.RecurrentRollback).
Greedy output is token-identical to Hugging Face's generate(); the coupled sampler gives
autoregressive's text for the same seed; the state after a partly rejected step is a fresh
prefill's; trees, compile, batches and layer views are refused with errors that say what to do."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3NextConfig"):
    pytest.skip("this transformers has no Qwen3-Next", allow_module_level=True)

from transformers.cache_utils import LinearAttentionCacheLayerMixin  # noqa: E402

from specdec import Speculator  # noqa: E402
from specdec.errors import IncompatibleModelsError, StrategyError  # noqa: E402
from specdec.strategies.autoregressive import Autoregressive  # noqa: E402
from specdec.strategies.base import BaseStrategy  # noqa: E402
from specdec.strategies.prompt_lookup import PromptLookup  # noqa: E402
from specdec.tree import CandidateTree  # noqa: E402
from specdec.verifier import Verifier  # noqa: E402

VOCAB = 96
NEW = 24
# scripts/gpu/check.sh runs the generation tests here on a GPU too (SPECDEC_TEST_DEVICE=cuda); the CI on the CPU
DEVICE = torch.device(os.environ.get("SPECDEC_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("SPECDEC_TEST_DEVICE=cuda, but this machine has no CUDA GPU", allow_module_level=True)


def qwen3_next(vocab: int = VOCAB):
    config = transformers.Qwen3NextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        decoder_sparse_step=1, full_attention_interval=2, max_position_embeddings=256)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)          # clear-cut greedy choices
    model.generation_config.pad_token_id = 0
    assert "linear_attention" in model.config.layer_types and "full_attention" in model.config.layer_types
    return model.to(DEVICE)


@pytest.fixture(scope="module")
def target():
    return qwen3_next()


def motif_prompt(seed: int) -> list[int]:
    """A motif repeated with a few changes: prompt lookup's drafts are then partly accepted."""
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, VOCAB, (6,), generator=gen).tolist()
    prompt = (motif * 5)[:28]
    for i in (7, 16, 22):
        prompt[i] = 3 + (prompt[i] + 17) % (VOCAB - 3)
    return prompt


class Scripted(BaseStrategy):
    """Drafts a chain of the next `depth` tokens of a known continuation, one of them wrong on every
    other step: whole chains kept (the forward's own state) and partly rejected ones (rolled back)."""
    name = "scripted"

    def __init__(self, prompt_len: int, continuation: list[int], depth: int = 4):
        self.prompt_len, self.continuation, self.depth, self.steps = prompt_len, continuation, depth, 0

    def propose(self, state):
        done = len(state.token_ids) - self.prompt_len
        tokens = list(self.continuation[done: done + min(self.depth, state.max_depth)])
        self.steps += 1
        if self.steps % 2 and len(tokens) > 2:
            tokens[2] = (tokens[2] + 1) % VOCAB
        return CandidateTree.chain(torch.tensor(tokens, dtype=torch.long, device=DEVICE))


def hf_greedy(model, prompt: list[int], n: int = NEW) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=0,
                         do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_identical_through_rejections(target, seed):
    """Chains on a Qwen3-Next target: the same tokens as HF greedy, with drafts both accepted whole
    and partly rejected (so both the kept state and the rolled-back one are exercised)."""
    prompt = motif_prompt(seed)
    expected = hf_greedy(target, prompt)
    for strategy in (Autoregressive(), PromptLookup(max_matches=1, num_tokens=4), Scripted(len(prompt), expected)):
        out = Speculator(target, None, strategy).generate(prompt, max_new_tokens=NEW, ignore_eos=True)
        assert out.token_ids == expected, strategy.name
    lengths = out.stats.accepted_lengths
    assert 4 in lengths and 2 in lengths, lengths             # whole chains and cut ones


def test_greedy_identical_through_the_row_linear_twin():
    """A vocabulary of 4096 makes the output layer large enough to be twinned (specdec.row_linear):
    the chain forwards and the rollback's second forward run through the twin, still identical."""
    if DEVICE.type != "cpu":
        pytest.skip("the RowLinear twin is a CPU path")
    from specdec.row_linear import RowLinear
    model = qwen3_next(vocab=4096)
    sd = Speculator(model, None, Autoregressive())
    assert sd.verifier.row_model is not None
    assert any(isinstance(m, RowLinear) for m in sd.verifier.row_model.modules())
    prompt = motif_prompt(6)
    expected = hf_greedy(model, prompt)
    out = Speculator(model, None, Scripted(len(prompt), expected)).generate(prompt, max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == expected
    assert 2 in out.stats.accepted_lengths


def test_coupled_sampler_gives_autoregressive_text(target):
    """The coupled sampler: the same seed gives the same text through chains and rollbacks as one
    token per forward does."""
    prompt = motif_prompt(4)
    for seed in (0, 1, 2):
        def sample(strategy):
            return Speculator(target, None, strategy).generate(prompt, max_new_tokens=NEW, temperature=0.8, seed=seed,
                                                               sampler="coupled", ignore_eos=True)
        reference = sample(Autoregressive()).token_ids
        for strategy in (PromptLookup(max_matches=1, num_tokens=4), Scripted(len(prompt), reference)):
            out = sample(strategy)
            assert out.token_ids == reference, (seed, strategy.name)
        assert 2 in out.stats.accepted_lengths, out.stats.accepted_lengths


def states(cache) -> list[torch.Tensor]:
    return [t.clone() for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)
            for t in list(layer.conv_states.values()) + list(layer.recurrent_states.values())]


@torch.inference_mode()
def test_rejected_rows_leave_a_fresh_prefills_state(target):
    """After a chain of 4 drafts of which 1 is accepted, every layer (recurrent state, conv state,
    attention KV) and the next forward's logits equal those of a fresh prefill of the kept text; a
    negative control (the rollback turned off) leaves a different state."""
    prompt = motif_prompt(5)
    chain = CandidateTree.chain(torch.tensor([7, 8, 9, 10], device=DEVICE))
    kept = [0, 1]                                      # the pending token and the first draft

    def after_step(roll_back: bool):
        verifier = Verifier(target)
        verifier.prefill(prompt[:-1])
        verifier.forward(prompt[-1], chain)
        if not roll_back:
            verifier.rollback = None
        verifier.commit(kept)
        return verifier

    stepped, fresh = after_step(True), Verifier(target)
    fresh.prefill(prompt + [7])
    assert stepped.prefix_len == fresh.prefix_len == len(prompt) + 1
    for a, b in zip(states(stepped.cache), states(fresh.cache), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for layer_a, layer_b in zip(stepped.cache.layers, fresh.cache.layers):
        if not isinstance(layer_a, LinearAttentionCacheLayerMixin):
            torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=1e-5, atol=1e-6)
    probe = CandidateTree.chain(torch.tensor([11, 12], device=DEVICE))
    torch.testing.assert_close(stepped.forward(8, probe).logits, fresh.forward(8, probe).logits, rtol=1e-4, atol=1e-5)

    unrolled = after_step(False)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(states(unrolled.cache), states(fresh.cache)))


@pytest.mark.parametrize("strategy", ["prompt_lookup", "token_recycling", "auto"])
def test_planned_and_lookup_trees_are_chains_here(target, strategy):
    """Strategies that size their trees (auto, token_recycling: the planner's best single path, on a cost
    profile timed on chains) and prompt lookup (its most recent match alone, whatever max_matches says) draft
    chains on a target verified on chains: greedy output identical to HF's, where any branch would be refused."""
    sd = Speculator(target, None, strategy)
    kept = 0
    for seed in (1, 2, 3):
        prompt = motif_prompt(seed)
        out = sd.generate(prompt, max_new_tokens=NEW, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt), (strategy, seed)
        kept += sum(out.stats.accepted_lengths)
    assert strategy == "prompt_lookup" or kept > 0        # the table's chains were drafted and kept


def test_auto_on_chains_gives_autoregressive_text_with_the_coupled_sampler(target):
    prompt = motif_prompt(4)
    for seed in (0, 1):
        def sample(strategy):
            return Speculator(target, None, strategy).generate(prompt, max_new_tokens=NEW, temperature=0.8, seed=seed,
                                                               sampler="coupled", ignore_eos=True)
        assert sample("auto").token_ids == sample(Autoregressive()).token_ids, seed


class Branching(BaseStrategy):
    """Always drafts two branches."""
    name = "branching"

    def propose(self, state):
        return CandidateTree.from_paths([[5, 6], [7]], device=DEVICE)


def test_tree_refused_saying_chains(target):
    """A tree with branches cannot be verified through one recurrent state: refused, naming what to use."""
    sd = Speculator(target, None, Branching())
    with pytest.raises(StrategyError, match="chains"):
        sd.generate(motif_prompt(1), max_new_tokens=NEW, ignore_eos=True)


def test_layer_views_refused(target):
    """early_exit drafts through the target's own layers, which would move their recurrent state."""
    from specdec.strategies.early_exit import EarlyExit
    with pytest.raises(IncompatibleModelsError, match="recurrent state"):
        Speculator(target, None, EarlyExit(exit_layer=2)).generate(motif_prompt(1), max_new_tokens=4)


def test_load_probe_refuses_a_state_that_is_not_rolled_back(target, monkeypatch):
    """Negative control of the load-time probe (verifier.check_rollback): with the rollback's restore
    made a no-op, the target is refused, saying its state cannot be rolled back."""
    from specdec.verifier import RecurrentRollback
    Verifier(target)                                                     # the real rollback passes the probe
    monkeypatch.setattr(RecurrentRollback, "restore", lambda self, cache: None)
    with pytest.raises(IncompatibleModelsError, match="cannot roll back"):
        Verifier(target)


def test_compile_refused(target):
    with pytest.raises(IncompatibleModelsError, match="compile: false"):
        Verifier(target, compile=True)


def test_batch_refused_saying_one_prompt_at_a_time(target):
    sd = Speculator(target, None, Autoregressive())
    with pytest.raises(IncompatibleModelsError, match="one prompt at a time"):
        sd.generate([motif_prompt(1), motif_prompt(2)], max_new_tokens=4, batch_size=2, ignore_eos=True)
