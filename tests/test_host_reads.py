"""The engine's host-sync budget (issue 13): per verify step, the loop, acceptance and commit read
the device back at most once when greedy or coupled, at most twice when rejection sampling.
Counted on CPU with tests/host_reads.py (every tensor -> host conversion), which holds the GPU's
budget without a GPU.

Counted from the first propose on: the call's setup (generation_config processing, prefill,
strategy reset) happens once per call and is not a step; it is reported in the message. Reads of
area "strategy" (drafting) are another budget's, not asserted here.
"""
from __future__ import annotations

import pytest
import torch

from conftest import noisy_copy, tiny_model
from host_reads import HostReads
from specdec import Speculator
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup

TARGET = tiny_model("llama", seed=0, sharpen=4.0)
DRAFT = noisy_copy(TARGET, 0.3)
PROMPT = [5, 17, 33, 9, 41, 60, 70, 5, 17, 33, 9, 41, 60]     # repeats itself: prompt lookup proposes

STRATEGIES = {
    "autoregressive": lambda: Autoregressive(),
    "prompt_lookup": lambda: PromptLookup(),
    "draft_chain": lambda: DraftModel(DRAFT, num_tokens=4, adaptive=False),
    "draft_tree": lambda: DraftModel(DRAFT, num_tokens=3, branching=[2, 2, 1], adaptive=False),
}
SAMPLERS = {   # name: (generate arguments, engine reads allowed per step)
    "greedy": (dict(temperature=0.0), 1),
    "coupled": (dict(temperature=0.8, sampler="coupled"), 1),
    "rejection": (dict(temperature=0.8, sampler="rejection"), 2),
}


def engine_reads(speculator, extra=None, **kwargs):
    """(engine reads from the first propose on, engine reads before it, steps, reads)."""
    strategy = speculator.strategy
    propose = strategy.propose
    setup = []

    def marked_propose(state):
        if not setup:
            setup.append(reads.total("engine"))
        return propose(state)

    strategy.propose = marked_propose
    try:
        with HostReads() as reads:
            if extra is None:
                out = speculator.generate(PROMPT, max_new_tokens=24, seed=0, ignore_eos=True, **kwargs)
            else:
                with extra():
                    out = speculator.generate(PROMPT, max_new_tokens=24, seed=0, ignore_eos=True, **kwargs)
    finally:
        del strategy.propose
    return reads.total("engine") - setup[0], setup[0], out.stats.target_forwards, reads


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_engine_reads_per_step_within_budget(strategy, sampler):
    kwargs, budget = SAMPLERS[sampler]
    speculator = Speculator(TARGET, None, STRATEGIES[strategy]())
    per_call, setup, steps, reads = engine_reads(speculator, **kwargs)
    assert steps > 0
    assert per_call <= budget * steps, (f"{strategy}/{sampler}: {per_call} engine reads in {steps} steps "
                                        f"(budget {budget} per step; {setup} at setup)\n{reads.report()}")


def test_the_counter_sees_a_deliberate_extra_read():
    """Negative control: one .item() more per step in the engine's acceptance breaks the budget."""
    from unittest import mock
    import specdec.loop
    original = specdec.loop.accept_greedy

    def accept_with_extra_read(tree, target_tokens):
        target_tokens[0].item()
        return original(tree, target_tokens)

    speculator = Speculator(TARGET, None, STRATEGIES["draft_chain"]())
    per_call, _setup, steps, reads = engine_reads(
        speculator, extra=lambda: mock.patch("specdec.loop.accept_greedy", accept_with_extra_read), temperature=0.0)
    assert per_call > steps, reads.report()
    assert per_call == 2 * steps, reads.report()


def test_profile_flag_reaches_the_stats():
    speculator = Speculator(TARGET, None, Autoregressive())
    out = speculator.generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert out.stats.profiled is True          # on a CPU the split is exact without profile
    assert out.stats.total_time_s > 0 and out.stats.verify_time_s > 0
    speculator.profile = True
    out = speculator.generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert out.stats.profiled is True and out.stats.as_dict()["profiled"] is True
