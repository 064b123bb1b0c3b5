"""mtp against Hugging Face's own `generate(use_mtp=True)`, run by the installed transformers
(scripts/interop/hf_self_spec.py), on tiny random checkpoints saved with their MTP modules: GLM-4.5 with 46
layers and DeepSeek-V3 with 61 (the layouts whose MTP layer index transformers looks for). Greedy: both give
plain greedy's output, and at every step Hugging Face drafted, specdec drafted the same chain from the same
position (one token per module)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "interop"))
import hf_self_spec  # noqa: E402


@pytest.mark.parametrize("architecture", ["glm-4.5", "deepseek-v3"])
def test_mtp_drafts_what_hugging_faces_does(tmp_path, architecture):
    model = hf_self_spec.tiny_with_mtp(str(tmp_path), architecture)
    result = hf_self_spec.compare_mtp(model, hf_self_spec.TINY_PROMPTS[0], 16)
    assert result.same_output
    assert result.full_depth >= 8                     # the premise: both drafted most positions
    assert result.same_steps == result.steps
