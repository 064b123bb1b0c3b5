"""On a CUDA GPU: every strategy's hot loop, after warm-up, makes no device sync but the explicit reads
that tests/host_reads.py counts and budgets.

From the first propose on, torch.cuda.set_sync_debug_mode("error") turns every synchronising CUDA
call into an error - a pageable copy to the host, a data-sized op (nonzero, boolean masks,
repeat_interleave without output_size), a blocking copy from the host - except inside the explicit
conversions to Python values (.tolist(), .item(), int(), bool(), ...), which are the budgeted reads
(one or two per step for the engine, per depth for a drafter) and are let through here. A sync this
test finds is one the CPU counter could not see.

Skipped without CUDA (this project's CI machine has none). scripts/gpu/check.sh runs it on a GPU: on
an H100 its first run found pageable host-to-device copies (now specdec.tree.host_to_device), and
every case passes since (benchmarks/results/gpu/h100.md)."""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from zoo import NAMES, strategies

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
PROMPTS = [PROMPT, [7, 8, 9, 10, 7, 8, 9], [3, 4, 5, 3, 4, 5, 3, 4, 5, 6, 7]]
MODES = {"greedy": dict(temperature=0.0), "coupled": dict(temperature=0.8, sampler="coupled"),
         "T=0.8": dict(temperature=0.8, sampler="rejection")}


@contextlib.contextmanager
def syncs_are_errors_from_first_propose(strategy_class):
    """Sync debug mode "error" from the first propose to the end; the explicit conversions let through."""
    originals = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}
    propose = strategy_class.propose

    def allowed(original):
        def conversion(tensor, *args, **kwargs):
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(0)
            try:
                return original(tensor, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        return conversion

    def strict_propose(strategy, state):
        torch.cuda.set_sync_debug_mode("error")
        return propose(strategy, state)

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, allowed(original))
        with mock.patch.object(strategy_class, "propose", strict_propose):
            yield
    finally:
        torch.cuda.set_sync_debug_mode(0)
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [False, True])
def test_hot_loop_has_no_hidden_sync(name, mode, batch):
    from conftest import tiny_model
    from specdec import Speculator
    target = tiny_model("llama", seed=1, sharpen=4.0).to("cuda")
    strategy = strategies(target)[name]()
    sd = Speculator(target, None, strategy)
    prompt, extra = (PROMPTS, dict(batch_size=len(PROMPTS))) if batch else (PROMPT, {})
    sd.generate(prompt, max_new_tokens=8, ignore_eos=True, seed=0, **MODES[mode], **extra)     # warm-up
    with syncs_are_errors_from_first_propose(type(strategy)):
        sd.generate(prompt, max_new_tokens=24, ignore_eos=True, seed=0, **MODES[mode], **extra)
