"""mtp against Hugging Face's own `generate(use_mtp=True)`, run by the installed transformers
(scripts/interop/hf_self_spec.py): a tiny random GLM-4.5 of 46 layers (GLM-4.5-Air's layout, whose MTP
layer index transformers looks for) saved with one MTP module. Greedy: both give plain greedy's output,
and wherever both drafted a position they drafted the same token there."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "interop"))
import hf_self_spec  # noqa: E402


def test_mtp_drafts_what_hugging_faces_does(tmp_path):
    model = hf_self_spec.tiny_glm_with_mtp(str(tmp_path))
    prompt = hf_self_spec.TINY_PROMPTS[0]
    plain = hf_self_spec.plain_greedy(model, prompt, 16)
    hf_tokens, hf_drafts = hf_self_spec.hf_mtp(model, prompt, 16)
    ours, our_drafts = hf_self_spec.specdec_mtp(model, prompt, 16)
    assert hf_tokens == ours == plain
    both = sorted(set(hf_drafts) & set(our_drafts))
    assert len(both) >= 10, (hf_drafts, our_drafts)           # the premise: both drafted most positions
    assert [hf_drafts[p] for p in both] == [our_drafts[p] for p in both]
