"""Every strategy on the device named by SPECDEC_TEST_DEVICE (default: cpu): greedy identity to
Hugging Face's generate(do_sample=False) on that device in fp32, one sequence and a ragged batch;
the compiled verify forward (CUDA graphs on a GPU); and the exact output law of a sampled call.

On the CI machine this runs on the CPU like the rest of the suite; scripts/gpu/check.sh runs it with
SPECDEC_TEST_DEVICE=cuda, where the same assertions cover the GPU code paths (pinned copies, device
generators, CUDA graphs) that no CPU run reaches."""
from __future__ import annotations

import os
from functools import lru_cache

import pytest
import torch

from conftest import tiny_model
from law import generation_law, laws_close, model_dist, sequence_law, token_law, total_variation
from zoo import NAMES, strategies

DEVICE = torch.device(os.environ.get("SPECDEC_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("SPECDEC_TEST_DEVICE=cuda, but this machine has no CUDA GPU", allow_module_level=True)

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11], [7, 8, 9, 10, 7, 8, 9], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7]]
NEW = 24


@lru_cache(maxsize=None)
def target():
    return tiny_model("llama", seed=1, sharpen=4.0).to(DEVICE)


@lru_cache(maxsize=None)
def reference(prompt: tuple[int, ...], new: int = NEW) -> tuple[int, ...]:
    model = target()
    ids = torch.tensor([list(prompt)], device=DEVICE)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                         eos_token_id=None)
    return tuple(out[0, len(prompt):].tolist())


def test_the_names_are_every_strategy_the_zoo_builds():
    """The device and sync tests parametrize over zoo.NAMES: a strategy added to the zoo is run by them."""
    assert tuple(strategies(target())) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_greedy_identity_on_device(name):
    from specdec import Speculator
    sd = Speculator(target(), None, strategies(target())[name]())
    out = sd.generate(PROMPTS[0], max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == list(reference(tuple(PROMPTS[0])))
    outs = sd.generate(PROMPTS, max_new_tokens=NEW, ignore_eos=True, batch_size=len(PROMPTS))
    assert [o.token_ids for o in outs] == [list(reference(tuple(p))) for p in PROMPTS]


@pytest.mark.parametrize("name", ["autoregressive", "draft tree"])
def test_compiled_verifier_on_device(name):
    """compile: true (on a GPU the static-shape forward is captured in CUDA graphs) gives the same
    tokens, twice in a row (the second call replays what the first compiled)."""
    from specdec import Speculator
    from specdec.compiled import compile_problem
    problem = compile_problem(DEVICE)
    if problem is not None:
        pytest.skip(problem)
    sd = Speculator(target(), None, strategies(target())[name](), compile=True)
    for _ in range(2):
        out = sd.generate(PROMPTS[0], max_new_tokens=NEW, ignore_eos=True)
        assert out.token_ids == list(reference(tuple(PROMPTS[0])))
    assert sd.verifier.static.compiled_rows


@pytest.mark.parametrize("name", ["draft chain", "eagle"])
def test_exact_law_on_device(name):
    """The law of a sampled call's new tokens, every random draw enumerated (tests/law.py), equals
    the target's own law, computed from the same model on the CPU."""
    from specdec import Speculator
    from specdec.sampling import SamplingParams
    from specdec.strategies.draft_model import DraftModel
    from specdec.strategies.eagle import Eagle
    from eagle_helpers import random_drafter
    on_cpu = tiny_model("llama", seed=0, vocab=5, hidden=16, layers=1, sharpen=20.0)
    model = tiny_model("llama", seed=0, vocab=5, hidden=16, layers=1, sharpen=20.0).to(DEVICE)
    draft = tiny_model("llama", seed=1, vocab=5, hidden=16, layers=1, sharpen=20.0).to(DEVICE)
    strategy = DraftModel(draft, num_tokens=2) if name == "draft chain" else Eagle(random_drafter(model), max_nodes=2,
                                                                                     top_k=2, depth=2)
    params = SamplingParams(1.0, top_k=2)
    prompt = [3, 4, 1, 0]
    law = token_law(generation_law(Speculator(model, None, strategy), prompt, 3, params))
    expected = sequence_law(model_dist(on_cpu, prompt, params), 3)
    assert abs(sum(law.values()) - 1) < 1e-6
    assert laws_close(law, expected, atol=1e-4), f"TV {total_variation(law, expected):.2e}"


def test_cudnn_attention_is_off_on_a_gpu():
    """On CUDA a Speculator turns PyTorch's cuDNN attention backend off (specdec.attention_backend); on a
    CPU the flag is left as it was."""
    from specdec import Speculator
    before = torch.backends.cuda.cudnn_sdp_enabled()
    Speculator(target(), None, "autoregressive")
    assert torch.backends.cuda.cudnn_sdp_enabled() == (before and DEVICE.type != "cuda")
