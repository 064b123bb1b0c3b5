"""Host reads (tensor -> Python conversions, a device sync on a GPU) that each drafter makes per
verify step, counted on CPU by tests/host_reads.py (area "strategy"): batched per depth, never per
drafted token or node. Budgets: a draft chain <= 1 per step, trees <= depth + 2, prompt lookup 0."""
from __future__ import annotations

import pytest
import torch

from conftest import noisy_copy, tiny_model
from eagle_helpers import random_drafter
from host_reads import HostReads
from specdec import Speculator
from specdec.heads import HeadsLayout, MedusaHeads
from specdec.heads.io import output_vocab
from specdec.sampling import TorchRandom
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.medusa import Medusa
from specdec.strategies.prompt_lookup import PromptLookup

TARGET = tiny_model("llama", seed=1, sharpen=4.0)
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
MODES = {"greedy": dict(temperature=0.0), "coupled": dict(temperature=0.8, sampler="coupled"),
         "T=0.8": dict(temperature=0.8, sampler="rejection")}


def heads(token_conditioned: bool) -> MedusaHeads:
    torch.manual_seed(0)
    h = MedusaHeads(HeadsLayout(3, 1, TARGET.config.hidden_size, output_vocab(TARGET),
                                token_conditioned=token_conditioned))
    with torch.no_grad():
        for p in h.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return h


# name -> (strategy builder, strategy reads allowed per verify step)
DRAFTERS = {
    "draft chain": (lambda: DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4), 1),
    "draft tree": (lambda: DraftModel(noisy_copy(TARGET, 0.3), branching=[3, 2, 1, 1]), 4 + 2),
    "medusa": (lambda: Medusa(heads(False), max_nodes=8, top_k=4), 3 + 2),
    "medusa conditioned": (lambda: Medusa(heads(True), max_nodes=8, top_k=4), 3 + 2),
    "eagle": (lambda: Eagle(random_drafter(TARGET), max_nodes=16, top_k=4, depth=6), 6 + 2),
    "prompt lookup": (lambda: PromptLookup(), 0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_strategy_host_reads_per_step_within_budget(drafter, mode):
    build, budget = DRAFTERS[drafter]
    sd = Speculator(TARGET, None, build())
    with HostReads() as reads:
        out = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=0, **MODES[mode])
    per_step = reads.total("strategy") / out.stats.target_forwards
    assert per_step <= budget, f"{drafter} {mode}: {per_step:.2f} strategy reads per step\n{reads.report()}"


def test_draft_chain_reads_nothing_per_drafted_token():
    """gamma = 8: reads per step do not grow with the chain (the tokens stay on the device)."""
    sd = Speculator(TARGET, None, DraftModel(noisy_copy(TARGET, 0.3), num_tokens=8))
    with HostReads() as reads:
        out = sd.generate(PROMPT, max_new_tokens=24, ignore_eos=True, seed=0, temperature=0.8)
    assert out.stats.proposed_nodes >= 16                    # precondition: long chains were drafted
    # what is left is once per call (building the target's generation_config processing), not per token
    assert reads.total("strategy") <= 3, reads.report()


def test_device_draw_is_the_random_sources_own_draw():
    """TorchRandom.draw_without_replacement (the drafters' draw) makes exactly torch.multinomial's draw
    without replacement (same generator state in, same tokens out), only without the read back to the host."""
    probs = torch.softmax(torch.randn(40, generator=torch.Generator().manual_seed(3)) * 2, dim=-1)
    for count in (1, 2, 3, 7, 40):
        ours = TorchRandom(torch.Generator().manual_seed(count)).draw_without_replacement(probs, count)
        theirs = torch.multinomial(probs, count, replacement=False, generator=torch.Generator().manual_seed(count)).tolist()
        assert ours.tolist() == theirs and len(set(theirs)) == count


def test_device_draw_reads_nothing_back():
    probs = torch.softmax(torch.randn(40, generator=torch.Generator().manual_seed(4)), dim=-1)
    with HostReads() as reads:
        TorchRandom(torch.Generator().manual_seed(0)).draw_without_replacement(probs, 3)
    assert reads.total() == 0, reads.report()
