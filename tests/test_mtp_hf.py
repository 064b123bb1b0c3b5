"""mtp against Hugging Face's own `generate(use_mtp=True)`, run by the installed transformers
(scripts/interop/hf_self_spec.py), on tiny random checkpoints saved with their MTP modules: GLM-4.5 with 46
layers and DeepSeek-V3 with 61 (the layouts whose MTP layer index transformers looks for), with one MTP module
and with several (Hugging Face chains them, module k drafting depth k from module k - 1's output; given the
patterns of every module's layer, hf_self_spec.announce_every_module). Greedy: both give plain greedy's output,
and at every step both drafted, specdec drafted the same chain from the same position (one token per module)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "interop"))
import hf_self_spec  # noqa: E402


@pytest.mark.parametrize("architecture, modules", [("glm-4.5", 1), ("deepseek-v3", 1), ("glm-4.5", 2)])
def test_mtp_drafts_what_hugging_faces_does(tmp_path, architecture, modules):
    model = hf_self_spec.tiny_with_mtp(str(tmp_path), architecture, modules=modules)
    result = hf_self_spec.compare_mtp(model, hf_self_spec.TINY_PROMPTS[0], 16)
    assert result.same_output
    assert result.full_depth >= 8                     # the premise: both drafted most positions
    assert result.same_steps == result.steps


def test_three_modules_whose_drafts_are_kept_draft_what_hugging_faces_do(tmp_path):
    """Over a small vocabulary the random modules' drafts are often kept, so the steps start after accepted drafts
    (Hugging Face then keeps the deeper modules' rows instead of recomputing them) and not only after misses."""
    vocab = hf_self_spec.SMALL_VOCAB
    model = hf_self_spec.tiny_with_mtp(str(tmp_path), "deepseek-v3", modules=3, vocab_size=vocab)
    result = hf_self_spec.compare_mtp(model, hf_self_spec.SMALL_PROMPTS[0], 24)
    assert result.same_output
    assert result.kept >= 3 and result.full_depth >= 3          # the premise: drafts were kept, at full depth
    assert result.same_steps == result.steps
