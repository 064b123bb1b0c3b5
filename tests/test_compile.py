"""`compile: true`: the verify forward compiled with static shapes (specdec.compiled) gives exactly
Hugging Face's greedy output, for plain decoding and for trees, and compiles once per bucket size.

Compiling takes seconds per bucket on a CPU, so the default run has one small test (autoregressive,
one bucket); the others are marked slow. Where torch.compile cannot run (no working C++ compiler
for inductor, say) the tests skip and say why."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from conftest import hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.compiled import BUCKETS, bucket_rows, compile_problem, padded_parents
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel

PROMPT = [5, 17, 33, 9, 41, 60]
NEW = 24


def needs_compile():
    problem = compile_problem("cpu")
    if problem is not None:
        pytest.skip(problem)


@lru_cache(maxsize=None)
def target_of(arch: str):
    return tiny_model(arch, seed=0)


@lru_cache(maxsize=None)
def reference(arch: str, prompt: tuple[int, ...], new: int) -> tuple[int, ...]:
    return tuple(hf_greedy(target_of(arch), list(prompt), new, eos_token_id=None))


def test_bucket_rows_and_padding():
    assert [bucket_rows(rows) for rows in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    assert bucket_rows(BUCKETS[-1] + 1) is None            # larger than every bucket: the eager forward
    assert padded_parents((-1, 0, 0), 5) == (-1, 0, 0, 0, 0)


def test_compiled_autoregressive_equals_hf_greedy():
    """Plain decoding through the compiled forward: one bucket (1 row) for the whole call, the
    prefill of a one-token prefix included."""
    needs_compile()
    prompt = (5, 17)
    sd = Speculator(target_of("llama"), None, Autoregressive(), compile=True)
    out = sd.generate(list(prompt), max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == list(reference("llama", prompt, NEW))
    assert sd.verifier.static.compiled_rows == {1}
    # a second call reuses the cache and the compiled graph
    cache = sd.verifier.cache
    out = sd.generate(list(prompt), max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == list(reference("llama", prompt, NEW))
    assert sd.verifier.cache is cache


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_compiled_draft_model_equals_hf_greedy(arch, shape):
    """A draft model's chains or trees (partly accepted, so commits gather non-contiguous rows in
    the static cache) through the compiled forward, padded to several buckets."""
    needs_compile()
    target = target_of(arch)
    branching = None if shape == "chain" else [2, 2, 1]
    strategy = DraftModel(noisy_copy(target), num_tokens=4, branching=branching, adaptive=False)
    sd = Speculator(target, None, strategy, compile=True)
    out = sd.generate(PROMPT, max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == list(reference(arch, tuple(PROMPT), NEW))
    assert 0 < sum(out.stats.accepted_lengths) < NEW, "precondition: partial acceptance"
    assert len(sd.verifier.static.compiled_rows) >= 2


@pytest.mark.slow
def test_compiled_forward_outgrows_its_cache():
    """A call that needs more slots than the static cache holds (a prompt longer than the planned
    capacity) falls back to a larger cache and stays exact."""
    needs_compile()
    target = target_of("llama")
    sd = Speculator(target, None, Autoregressive(), compile=True)
    sd.verifier.static.start(1)                           # a 256-slot cache
    small = sd.verifier.static.capacity
    prompt = [(7 * i) % 90 + 3 for i in range(small - 8)]
    sd.verifier.reserve(1)                                # plan far too little: the forward must grow it
    from specdec.loop import decode       # drive the loop directly so reserve() is not overridden
    from specdec.sampling import SamplingParams
    from specdec.stopping import StopRules
    from specdec.types import Stats
    steps = decode(sd.verifier, sd.strategy, prompt, SamplingParams(0.0, 0, 1.0),
                   StopRules(max_new_tokens=16, eos_token_ids=frozenset()), torch.Generator(), Stats())
    tokens = [token for run, _ in steps for token in run]
    assert tokens == hf_greedy(target, prompt, 16, eos_token_id=None)
    assert sd.verifier.static.capacity > small


def test_compile_refuses_flex_attention():
    import transformers as T
    from specdec.errors import IncompatibleModelsError
    config = T.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    target = T.AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()
    with pytest.raises(IncompatibleModelsError, match="attn_implementation=\"sdpa\""):
        Speculator(target, None, Autoregressive(), compile=True)
    Speculator(target, None, Autoregressive())          # without compile, flex verifies trees as before


def test_module_hooks_run_outside_the_compiled_graph():
    """A forward hook on the target (a benchmark's forward meter, say) fires once per verify
    forward, eagerly: its Python side effects are neither traced nor a cause of recompiles."""
    needs_compile()
    target = target_of("llama")
    calls = []
    handle = target.register_forward_hook(lambda module, args, output: calls.append(output.logits.shape[1]))
    try:
        sd = Speculator(target, None, Autoregressive(), compile=True)
        out = sd.generate([5, 17], max_new_tokens=8, ignore_eos=True)
    finally:
        handle.remove()
    assert out.token_ids == list(reference("llama", (5, 17), 8))
    assert len(calls) == 1 + out.stats.target_forwards          # the prefill, then one per step
    assert sd.verifier.static.compiled_rows == {1}


def test_a_cpu_drops_compile_with_one_line(monkeypatch, caplog):
    """On a CPU the compiled forward runs slower than the eager one: a Speculator asked for it runs
    eagerly, says why in one warning, and generates the same tokens."""
    monkeypatch.delenv("SPECDEC_COMPILE_ON_CPU", raising=False)
    with caplog.at_level("WARNING", logger="specdec"):
        sd = Speculator(target_of("llama"), None, Autoregressive(), compile=True)
    assert sd.verifier.static is None
    notes = [r.getMessage() for r in caplog.records if "compile: true is not used on a CPU" in r.getMessage()]
    assert len(notes) == 1 and "SPECDEC_COMPILE_ON_CPU=1" in notes[0]
    out = sd.generate([5, 17], max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == list(reference("llama", (5, 17), NEW))


def test_compiled_forward_compiles_once_per_bucket():
    """Recompiles are counted (torch._dynamo's counters) and bounded: two calls compile one graph per
    bucket they use (the prompt's prefix, then one row per step) and never recompile."""
    needs_compile()
    from torch._dynamo.utils import counters
    recompiles = sum(counters["recompiles"].values())
    sd = Speculator(target_of("llama"), None, Autoregressive(), compile=True)
    frames_before = counters["stats"]["unique_graphs"]
    for _ in range(2):
        assert sd.generate([5, 17, 33], max_new_tokens=NEW, ignore_eos=True).token_ids == \
            list(reference("llama", (5, 17, 33), NEW))
    assert 1 <= counters["stats"]["unique_graphs"] - frames_before <= len(sd.verifier.static.compiled_rows) <= 2
    assert sum(counters["recompiles"].values()) == recompiles
