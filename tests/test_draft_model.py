"""draft_model specifics beyond greedy identity: the confidence early stop."""
from __future__ import annotations

from conftest import hf_greedy, tiny_model
from specdec import Speculator
from specdec.strategies.draft_model import DraftModel


def test_confidence_early_stop_keeps_greedy_identity_and_shortens_chains():
    target = tiny_model("llama", seed=0, sharpen=4.0)
    draft = tiny_model("llama", seed=1, sharpen=4.0)
    prompt = [5, 17, 33, 8, 41, 9, 12]
    reference = hf_greedy(target, prompt, 24, eos_token_id=None)
    plain = Speculator(target, None, DraftModel(draft, num_tokens=6)).generate(prompt, max_new_tokens=24, ignore_eos=True)
    early = Speculator(target, None, DraftModel(draft, num_tokens=6, min_confidence=0.6)).generate(
        prompt, max_new_tokens=24, ignore_eos=True)
    assert early.token_ids == reference and plain.token_ids == reference
    per_step_plain = plain.stats.proposed_nodes / plain.stats.target_forwards
    per_step_early = early.stats.proposed_nodes / early.stats.target_forwards
    assert per_step_early < per_step_plain
