"""early_exit against Hugging Face's own `generate(assistant_early_exit=E)`, run by the installed
transformers (scripts/interop/hf_self_spec.py): on a tiny random llama of 4 layers, greedy chains of 4,
every exit layer 1 .. 3 gives the same output (plain greedy's), the same drafted tokens at every step
and so the same number of target forwards."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "interop"))
import hf_self_spec  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return hf_self_spec.tiny_llama(layers=4)


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_early_exit_drafts_what_hugging_faces_does(model, exit_layer):
    result = hf_self_spec.compare_early_exit(model, hf_self_spec.TINY_PROMPTS, exit_layer, num_tokens=4, new_tokens=24)
    assert result.same_output
    assert result.same_drafts
    assert result.hf_forwards == result.specdec_forwards < result.new_tokens     # drafts were kept


def test_a_run_records_hugging_faces_drafts(model):
    """The premise: the recorder sees Hugging Face's generator draft, and its chains are 4 long."""
    run = hf_self_spec.hf_early_exit(model, hf_self_spec.TINY_PROMPTS[0], 2, num_tokens=4, new_tokens=24)
    assert run.drafts and max(len(d) for d in run.drafts) == 4
    assert run.tokens == hf_self_spec.plain_greedy(model, hf_self_spec.TINY_PROMPTS[0], 24)
