"""The exact output law of a batched generate() call: two rows through the real batched loop (one
target forward per step over both rows, each row's commit at its own fill), every random draw of
both rows enumerated (tests/law.py). The joint law of the two rows' new tokens must be the product
of the target's laws for each prompt; a negative control that swaps the rows at commit must fail."""
from __future__ import annotations

from unittest import mock

import pytest

from conftest import tiny_model
from law import enumerate_law, laws_close, model_dist, sequence_law, total_variation
from specdec import Speculator
from specdec.batch import BatchVerifier
from specdec.sampling import SamplingParams
from specdec.strategies.draft_model import DraftModel

V = 5
NEW = 2
PROMPTS = [[3, 4, 1, 0], [2, 1, 4]]
PARAMS = SamplingParams(1.0, top_k=2)


def tiny(seed: int):
    return tiny_model("llama", seed=seed, vocab=V, hidden=16, layers=1, sharpen=20.0)


TARGET, DRAFT = tiny(0), tiny(1)


def batch_law(sd: Speculator) -> dict:
    """{(row 0's new tokens, row 1's new tokens): exact probability} of one batched call."""
    current = []

    def run(rng):
        current[:] = [rng]
        outs = sd.generate(PROMPTS, max_new_tokens=NEW, temperature=PARAMS.temperature, top_k=PARAMS.top_k,
                           ignore_eos=True, seed=[1, 2])
        return tuple(tuple(out.token_ids) for out in outs)

    with mock.patch("specdec.api.TorchRandom", lambda generator: current[0]):
        return enumerate_law(run)


def expected_law() -> dict:
    laws = [sequence_law(model_dist(TARGET, prompt, PARAMS), NEW) for prompt in PROMPTS]
    return {(a, b): pa * pb for a, pa in laws[0].items() for b, pb in laws[1].items()}


@pytest.mark.parametrize("strategy", ["chain", "tree"])
def test_two_rows_have_the_targets_law(strategy):
    draft = DraftModel(DRAFT, num_tokens=2) if strategy == "chain" else DraftModel(DRAFT, branching=[2])
    law = batch_law(Speculator(TARGET, None, draft))
    expected = expected_law()
    assert abs(sum(law.values()) - 1) < 1e-6
    assert laws_close(law, expected), f"joint law differs from the target's: TV {total_variation(law, expected):.2e}"


def test_rows_swapped_at_commit_fail_the_same_check():
    real = BatchVerifier.commit

    def swapped(self, row, kept_rows, *on_device):
        return real(self, self.rows - 1 - row, kept_rows, *on_device)

    with mock.patch.object(BatchVerifier, "commit", swapped):
        law = batch_law(Speculator(TARGET, None, DraftModel(DRAFT, num_tokens=2)))
    assert not laws_close(law, expected_law())
