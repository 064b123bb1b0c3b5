"""The verifier and strategies on the models people actually load: sliding-window layers (Mistral's
one window for all layers, Gemma-2 / Qwen2 alternating sliding and full layers), the attention
implementations a target may be loaded with, and what "identical" means in bf16.

Every greedy test compares with Hugging Face `generate(do_sample=False)` on the same model, with
prompt + new tokens well past the window, so trees straddle the window's edge at every step."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch
import transformers as T

from conftest import hf_greedy, noisy_copy
from specdec import Speculator
from specdec.benchmarks.ties import ulp
from specdec.errors import IncompatibleModelsError
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.tree import CandidateTree
from specdec.verifier import Verifier

VOCAB = 96
WINDOW = 16
PROMPT_LEN = 64
N = 24
SLIDING_KINDS = ["mistral", "gemma2", "qwen2"]
STRATEGIES = ["autoregressive", "prompt_lookup", "chain", "tree"]
DRAFT_DEPTH = 4


# ---------------------------------------------------------------------- models
def sliding_config(kind: str, window: int | None = WINDOW):
    """A tiny config of each sliding layout; window=None gives the same model without windows."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if kind == "mistral":        # one sliding window, every layer, no layer_types
        return T.MistralConfig(num_hidden_layers=2, sliding_window=window, **common)
    alternating = ["sliding_attention", "full_attention"] * 2
    full = ["full_attention"] * 4
    if kind == "gemma2":         # Gemma-2: alternating sliding / full layers
        return T.Gemma2Config(num_hidden_layers=4, head_dim=8, sliding_window=window or 4096,
                              layer_types=alternating if window else full, tie_word_embeddings=False,
                              initializer_range=0.2, **common)
    if kind == "qwen2":          # Qwen2 with use_sliding_window and explicit layer_types
        return T.Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=window or 4096,
                             layer_types=alternating if window else full, **common)
    raise ValueError(kind)


def build(config, impl: str | None = None, seed: int = 0, sharpen: float = 4.0):
    """A random tiny model, its output layer scaled so its greedy choices are clear-cut (drafts
    then agree with it often enough to exercise accepted paths)."""
    torch.manual_seed(seed)
    impl = impl or ("eager" if config.model_type == "gemma2" else "sdpa")
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    model.generation_config.pad_token_id = 0
    return model


@lru_cache(maxsize=None)
def sliding_model(kind: str):
    return build(sliding_config(kind))



def long_prompt(length: int = PROMPT_LEN, seed: int = 3) -> list[int]:
    """A prompt longer than the window, a short motif repeated with a few changes, so prompt
    lookup finds several continuations to merge into a tree."""
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, VOCAB, (12,), generator=gen).tolist()
    prompt = (motif * (length // len(motif) + 1))[:length]
    for i in torch.randint(0, length, (length // 8,), generator=gen).tolist():
        prompt[i] = int(torch.randint(3, VOCAB, (1,), generator=gen))
    return prompt


def strategy_of(name: str, target):
    if name == "autoregressive":
        return Autoregressive()
    if name == "prompt_lookup":
        return PromptLookup()
    if name == "chain":
        return DraftModel(noisy_copy(target, noise=0.15), num_tokens=DRAFT_DEPTH)
    return DraftModel(noisy_copy(target, noise=0.15), branching=[3, 2, 2, 1])          # DRAFT_DEPTH levels


def check_identity(target, strategy_name: str, prompt: list[int], n: int = N, cache: str = "grown"):
    """cache: "grown" (the default cache), "static" (compile: true's fixed-size cache and masks,
    run eagerly) or "compiled" (compile: true)."""
    expected = hf_greedy(target, prompt, n, eos_token_id=None)
    sd = Speculator(target, None, strategy_of(strategy_name, target), compile=cache != "grown")
    if cache == "static":
        sd.verifier.static.buckets = ()          # every forward takes the eager path over the static cache
    out = sd.generate(prompt, max_new_tokens=n, ignore_eos=True)
    assert out.token_ids == expected
    if strategy_name != "autoregressive":
        assert out.stats.proposed_nodes > 0, "precondition: the strategy proposed candidates"
    if strategy_name in ("chain", "tree"):
        accepted = out.stats.accepted_lengths
        rejected = [a for a in accepted[:-1] if a < DRAFT_DEPTH]     # (the last step may be cut by the budget)
        assert sum(accepted) > 0 and rejected, "precondition: some drafts accepted, some rejected"
    return out


# ---------------------------------------------------------------------- 1. sliding windows
@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_window_is_exercised(kind):
    """Precondition of the identity tests: with these prompts the window changes the output (the
    same weights without a window continue differently)."""
    target = sliding_model(kind)
    unwindowed = build(sliding_config(kind, window=None))
    unwindowed.load_state_dict(target.state_dict())
    prompt = long_prompt()
    assert len(prompt) + N > len(prompt) > WINDOW
    assert hf_greedy(target, prompt, N, eos_token_id=None) != hf_greedy(unwindowed, prompt, N, eos_token_id=None)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_sliding_window_greedy_identity(kind, strategy_name):
    target = sliding_model(kind)
    check_identity(target, strategy_name, long_prompt())


@pytest.mark.parametrize("strategy_name", ["autoregressive", "tree"])
@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_sliding_window_static_cache_greedy_identity(kind, strategy_name):
    """compile: true's fixed-size cache: the windows are carried by its masks over the whole buffer."""
    check_identity(sliding_model(kind), strategy_name, long_prompt(), cache="static")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_sliding_window_compiled_greedy_identity(kind):
    from specdec.compiled import compile_problem
    if compile_problem("cpu"):
        pytest.skip(compile_problem("cpu"))
    check_identity(sliding_model(kind), "tree", long_prompt(), cache="compiled")


@pytest.mark.parametrize("kind", SLIDING_KINDS)
def test_sliding_window_tree_forward_equals_path_forwards(kind):
    """A small window (3) inside a deep tree: each node's logits equal a plain forward over the
    prefix + its path, so the window also cuts the tree's own ancestors."""
    target = build(sliding_config(kind, window=3))
    prompt = long_prompt(20)
    # pending -> a(11) -> b(12) -> c(13) -> d(14); a -> e(15) -> f(16); pending -> g(17) -> h(18)
    tree = CandidateTree(torch.tensor([11, 12, 13, 14, 15, 16, 17, 18]), (-1, 0, 1, 2, 0, 4, -1, 6))
    verifier = Verifier(target)
    verifier.prefill(prompt[:-1])
    logits = verifier.forward(prompt[-1], tree).logits                  # [1 + N, V]
    for node in range(-1, tree.num_nodes):
        path, walk = [], node
        while walk != -1:
            path.append(int(tree.tokens[walk]))
            walk = tree.parents[walk]
        with torch.no_grad():
            expected = target(torch.tensor([prompt + path[::-1]])).logits[0, -1]
        torch.testing.assert_close(logits[node + 1], expected, atol=1e-5, rtol=1e-5)


def test_chunked_attention_refused():
    config = T.Llama4TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                attention_chunk_size=8, num_local_experts=2, max_position_embeddings=512)
    target = T.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(IncompatibleModelsError, match="chunked_attention"):
        Speculator(target, None, Autoregressive())


# ---------------------------------------------------------------------- 2. attention implementations
@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention without torch.compile, for HF's reference and for us alike: PyTorch's unfused
    reference of the same kernel and an uncompiled block mask (the compiled CPU kernel does not
    build on this machine, and compiling a block mask per shape takes seconds)."""
    from torch.nn.attention import flex_attention as flex
    from transformers import masking_utils
    from transformers.integrations.flex_attention import WrappedFlexAttention
    monkeypatch.setattr(WrappedFlexAttention, "__call__", lambda self: flex.flex_attention)
    monkeypatch.setattr(masking_utils, "create_block_mask",
                        lambda *args, _compile=False, **kwargs: flex.create_block_mask(*args, **kwargs))


@pytest.mark.parametrize("kind", ["llama", "mistral"])
@pytest.mark.parametrize("impl", ["eager", "sdpa",
                                  pytest.param("flex_attention", marks=pytest.mark.slow)])   # ~30 s uncompiled
def test_attention_implementations_tree_identity(impl, kind, request):
    if impl == "flex_attention":
        request.getfixturevalue("eager_flex")
    if kind == "llama":
        config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    else:
        config = sliding_config("mistral")
    target = build(config, impl)
    assert target.config._attn_implementation == impl
    check_identity(target, "tree", long_prompt())


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "paged|sdpa"])
def test_attention_without_tree_masks_refused(impl):
    target = build(sliding_config("mistral"))
    target.config._attn_implementation_internal = impl      # as loaded with attn_implementation=impl
    with pytest.raises(IncompatibleModelsError, match=r"attn_implementation=\"sdpa\""):
        Speculator(target, None, DraftModel(target, branching=[2, 2]))


# ---------------------------------------------------------------------- 4. bf16 / fp16
LOW_N = 128
LOW_PROMPT = [5, 17, 33, 9, 41, 60, 70]


def hf_greedy_with_logits(model, ids: list[int], n: int):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=None, return_dict_in_generate=True,
                         output_logits=True)
    return out.sequences[0, len(ids):].tolist(), [logits[0].float() for logits in out.logits]


def mismatch_gaps(model, prompt: list[int], tokens: list[int], dtype: torch.dtype) -> list[float]:
    """Walk `tokens` against HF greedy: at each mismatch, the gap between HF's top two logits
    there in units of the dtype's resolution at that magnitude; then continue HF from `tokens`'
    choice (so every mismatch is checked, not only the first)."""
    gaps, pos = [], 0
    while pos < len(tokens):
        reference, logits = hf_greedy_with_logits(model, prompt + tokens[:pos], len(tokens) - pos)
        k = next((i for i, (a, b) in enumerate(zip(tokens[pos:], reference)) if a != b), None)
        if k is None:
            break
        top = torch.topk(logits[k], 2).values
        gaps.append(float(top[0] - top[1]) / ulp(float(top[0]), dtype))
        pos += k + 1
    return gaps


@lru_cache(maxsize=None)
def low_precision_pair(arch: str, dtype: torch.dtype):
    """A tiny target with flat logits (ties are common in low precision) and a noisy draft."""
    from conftest import tiny_model
    target = tiny_model(arch, seed=0, sharpen=0.5).to(dtype)
    return target, noisy_copy(target, noise=0.2)


@pytest.mark.parametrize("strategy_name", ["autoregressive", "prompt_lookup", "tree"])
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_mismatches_are_top2_ties(dtype, arch, strategy_name):
    """In bf16/fp16 a tree forward is not bit-identical to a one-row forward, so greedy output may
    differ from HF's, but only where HF's own top two logits tie within the dtype's resolution
    (gap <= one unit in the last place at their magnitude; in practice an exact tie)."""
    target, draft = low_precision_pair(arch, dtype)
    strategy = {"autoregressive": Autoregressive(), "prompt_lookup": PromptLookup(),
                "tree": DraftModel(draft, branching=[2, 2, 1])}[strategy_name]
    out = Speculator(target, None, strategy).generate(LOW_PROMPT, max_new_tokens=LOW_N, ignore_eos=True)
    assert len(out.token_ids) == LOW_N
    gaps = mismatch_gaps(target, LOW_PROMPT, out.token_ids, dtype)
    assert all(gap <= 1.0 for gap in gaps), gaps


def test_low_precision_tie_check_catches_real_mismatches():
    """Negative control: tokens that are not the target's (the noisy draft's own greedy text) fail
    the same check, with gaps far beyond the dtype's resolution."""
    target, draft = low_precision_pair("qwen2", torch.bfloat16)
    wrong = hf_greedy(draft, LOW_PROMPT, 32, eos_token_id=None)
    gaps = mismatch_gaps(target, LOW_PROMPT, wrong, torch.bfloat16)
    assert gaps and max(gaps) > 1.0


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_sliding_window_draft_trees_keep_the_drafts_window(kind):
    """A sliding-window draft's tree forward applies its own window: a width-1 tree drafts exactly
    what its chain drafts (each chain step is a plain forward with HF's own windowed mask)."""
    from specdec.sampling import SamplingParams, TorchRandom
    from specdec.types import DecodeState
    model = sliding_model(kind)
    proposals = []
    for shape in (dict(num_tokens=6), dict(branching=[1] * 6)):
        strategy = DraftModel(model, **shape)
        strategy.bind(model, None)
        trees = []
        for seed in (0, 1, 2):
            prompt = torch.randint(3, VOCAB, (48,), generator=torch.Generator().manual_seed(seed)).tolist()
            state = DecodeState(token_ids=prompt, prompt_len=len(prompt), sampling=SamplingParams(),
                                rng=TorchRandom(torch.Generator()), max_depth=10)
            strategy.reset(state)
            trees.append(strategy.propose(state).tokens.tolist())
        proposals.append(trees)
    assert proposals[0] == proposals[1]
