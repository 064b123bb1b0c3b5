"""Host syncs that each drafter makes per verify step, counted on CPU by tests/host_reads.py (area
"strategy").

Reads (device -> host, a sync on a GPU): batched per depth, never per drafted token or node.
Budgets: a draft chain <= 1 per step, trees <= depth + 2, prompt lookup 0, lookahead 1 (the target's argmax
at the window's last level: its next guesses are host data, as its n-gram pool is).

Writes (host -> device), after the call's first proposal (its setup: the prompt fed to the drafter,
the generation_config processing built): the drafters feed the pending token and the accepted
tokens from the device (DecodeState.pending, the tree's own tokens), so per step
  * none for the draft model and medusa (their trees' shapes were seen in the
    warm-up call), <= 1 for prompt lookup (its guesses are host data by nature) and lookahead, <= depth for eagle
    (its dynamic tree levels' masks: one copy per new shape), plus the coupled noise's key window;
  * rejection sampling (T=0.8) the same: the engine's drawn token stays on the device too."""
from __future__ import annotations

from unittest import mock

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
from specdec.strategies.token_recycling import TokenRecycling
from specdec.strategies.lookahead import Lookahead

pytestmark = pytest.mark.usefixtures("gpu_paths")   # a GPU's budget (conftest.gpu_paths)

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


# name -> (strategy builder, strategy reads allowed per verify step, writes allowed per step after the first)
DRAFTERS = {
    "draft chain": (lambda: DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4), 1, 0),
    "draft tree": (lambda: DraftModel(noisy_copy(TARGET, 0.3), branching=[3, 2, 1, 1]), 4 + 2, 0),
    "medusa": (lambda: Medusa(heads(False), max_nodes=8, top_k=4), 3 + 2, 0),
    "medusa conditioned": (lambda: Medusa(heads(True), max_nodes=8, top_k=4), 3 + 2, 0),
    "eagle": (lambda: Eagle(random_drafter(TARGET), max_nodes=16, top_k=4, depth=6), 6 + 2, 6),
    "prompt lookup": (lambda: PromptLookup(), 0, 1),
    "token recycling": (lambda: TokenRecycling(profile=False), 0, 0),
    "lookahead": (lambda: Lookahead(window=3, ngram=3, guesses=2), 1, 1),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_strategy_host_reads_per_step_within_budget(drafter, mode):
    build, budget, _ = DRAFTERS[drafter]
    sd = Speculator(TARGET, None, build())
    with HostReads() as reads:
        out = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=0, **MODES[mode])
    per_step = reads.total("strategy") / out.stats.target_forwards
    assert per_step <= budget, f"{drafter} {mode}: {per_step:.2f} strategy reads per step\n{reads.report()}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_strategy_host_writes_per_step_within_budget(drafter, mode):
    build, _, budget = DRAFTERS[drafter]
    strategy = build()
    sd = Speculator(TARGET, None, strategy)
    sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=0, **MODES[mode])     # warm-up: shapes seen
    cls, propose, after_first = type(strategy), type(strategy).propose, []

    def marked(self, state):
        tree = propose(self, state)
        if not after_first:
            after_first.append(reads.writes("strategy"))
        return tree

    with HostReads() as reads, mock.patch.object(cls, "propose", marked):
        out = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=0, **MODES[mode])
    steps = out.stats.target_forwards - 1
    allowed = budget * steps + (1 if mode == "coupled" else 0)
    writes = reads.writes("strategy") - after_first[0]
    assert writes <= allowed, f"{drafter} {mode}: {writes} strategy writes in {steps} steps\n{reads.report('write')}"


def test_the_counter_sees_a_draft_fed_from_the_host():
    """Negative control: a draft model that feeds its catch-up tokens from the host (as main did)
    writes once per step, over its greedy budget of none."""
    strategy = DraftModel(noisy_copy(TARGET, 0.3), num_tokens=4)
    sd = Speculator(TARGET, None, strategy)
    real = DraftModel._catch_up
    with HostReads() as reads, mock.patch.object(DraftModel, "_catch_up",
                                                 lambda self, token_ids, pending=None: real(self, token_ids)):
        out = sd.generate(PROMPT, max_new_tokens=16, ignore_eos=True, seed=0, temperature=0.0)
    assert reads.writes("strategy") >= out.stats.target_forwards, reads.report("write")


def test_draft_chain_reads_nothing_per_drafted_token():
    """gamma = 8: reads per step do not grow with the chain (the tokens stay on the device)."""
    sd = Speculator(TARGET, None, DraftModel(noisy_copy(TARGET, 0.3), num_tokens=8))
    with HostReads() as reads:
        out = sd.generate(PROMPT, max_new_tokens=24, ignore_eos=True, seed=0, temperature=0.8)
    assert out.stats.proposed_nodes >= 16                    # precondition: long chains were drafted
    # what is left is once per call (building the target's generation_config processing), not per token
    assert reads.total("strategy") <= 3, reads.report()


def test_device_draw_is_the_random_sources_own_draw():
    """TorchRandom.draw_without_replacement (the drafters' draw) of two tokens or more makes exactly
    torch.multinomial's draw without replacement (same generator state in, same tokens out), only without
    the read back to the host; of one token, the source's own `draw` (the same law, drawn cheaper)."""
    probs = torch.softmax(torch.randn(40, generator=torch.Generator().manual_seed(3)) * 2, dim=-1)
    for count in (2, 3, 7, 40):
        ours = TorchRandom(torch.Generator().manual_seed(count)).draw_without_replacement(probs, count)
        theirs = torch.multinomial(probs, count, replacement=False, generator=torch.Generator().manual_seed(count)).tolist()
        assert ours.tolist() == theirs and len(set(theirs)) == count
    for seed in range(20):
        one = TorchRandom(torch.Generator().manual_seed(seed)).draw_without_replacement(probs, 1)
        assert one.tolist() == TorchRandom(torch.Generator().manual_seed(seed)).draw(probs).tolist()


def test_draw_has_the_weights_law_and_never_a_weight_zero_token():
    """TorchRandom.draw (inverse CDF): Pearson's test of 40000 draws from unnormalized weights with zeros
    (at both ends and inside); at the extreme uniforms, the first and the last token of weight > 0."""
    from collections import Counter

    from specdec.sampling import inverse_cdf_token
    from test_coupled import chi_square
    weights = torch.tensor([0.0, 2.0, 0.0, 0.5, 4.0, 0.0, 0.015625, 1.484375, 0.0, 0.0])   # total 8: exact
    rng = TorchRandom(torch.Generator().manual_seed(7))
    total = 40000
    counts = Counter(int(rng.draw(weights)) for _ in range(total))
    law = {token: float(w / weights.sum()) for token, w in enumerate(weights) if w > 0}
    assert set(counts) <= set(law)                                  # no token of weight 0, ever
    statistic, critical = chi_square(counts, law, total)
    assert statistic < critical, (statistic, critical, counts)
    edges = torch.tensor([0.0, 1.0 - 2.0 ** -53, 0.2, 0.25], dtype=torch.float64)    # points 0, ~8, 1.6, 2
    picked = [int(inverse_cdf_token(weights, edge[None])) for edge in edges]
    assert picked == [1, 7, 1, 3]                   # first positive; last positive; inside token 1; token 3 from its start


def test_device_draw_reads_nothing_back():
    probs = torch.softmax(torch.randn(40, generator=torch.Generator().manual_seed(4)), dim=-1)
    with HostReads() as reads:
        TorchRandom(torch.Generator().manual_seed(0)).draw_without_replacement(probs, 3)
    assert reads.total() == 0, reads.report()
