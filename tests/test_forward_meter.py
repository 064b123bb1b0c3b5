"""The benchmark's forward meter (benchmarks/meter.py): every model forward a generation runs is counted
once, in its role, whatever object runs the target's layers (early_exit's KV reuse drafts and verifies
through views of the target, not the target module)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from conftest import tiny_model
from specdec import Speculator
from specdec.benchmarks.meter import ForwardMeter, watch_rows
from specdec.benchmarks.rows import SpecdecRow
from specdec.strategies.early_exit import EarlyExit

PROMPT = list(range(5, 30))


class OutermostForwards:
    """Counts the forwards of any torch module that run inside no other module's forward (global hooks)."""

    def __init__(self):
        self.depth = self.calls = 0
        self.handles = [register_module_forward_pre_hook(self._before), register_module_forward_hook(self._after)]

    def _before(self, _module, _args):
        self.depth += 1

    def _after(self, _module, _args, _output):
        self.depth -= 1
        self.calls += self.depth == 0

    def close(self):
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_an_early_exit_row_has_every_forward_counted_once(reuse_kv):
    target = tiny_model("llama", seed=0, layers=4, sharpen=3.0)
    strategy = EarlyExit(2, num_tokens=3, reuse_kv=reuse_kv)
    row = SpecdecRow("early_exit", Speculator(target, None, strategy))
    assert (strategy.split is not None) == reuse_kv          # the reuse runs here, so its parts are exercised
    meter = ForwardMeter(torch.device("cpu"))
    watch_rows(meter, target, [row])
    outermost = OutermostForwards()
    try:
        with meter.tally() as tally:
            generation = row.generate(PROMPT, 20, 0.0, 0)
    finally:
        outermost.close()
        meter.close()
    assert tally.target_calls == generation.stats["target_forwards"] + 1          # the verifies and the prefill
    assert tally.target_calls + tally.draft_calls == outermost.calls              # nothing missed, nothing twice
    assert tally.draft_calls > 0 and tally.draft_time_s > 0 and tally.target_time_s > 0


def test_a_watched_module_inside_another_counts_once_under_the_outer_role():
    inner = torch.nn.Linear(4, 4)
    outer = torch.nn.Sequential(inner, torch.nn.ReLU())
    meter = ForwardMeter(torch.device("cpu"))
    meter.watch(outer, "target")
    meter.watch(inner, "draft")

    def fail(_module, _args):
        raise RuntimeError("a forward that fails")
    with meter.tally() as tally:
        outer(torch.ones(1, 4))                 # inner runs inside: one target forward
        inner(torch.ones(1, 4))                 # inner alone: one draft forward
        handle = outer.register_forward_pre_hook(fail)
        with pytest.raises(RuntimeError):
            outer(torch.ones(1, 4))             # counted, and its level closed all the same
        handle.remove()
        inner(torch.ones(1, 4))
    meter.close()
    assert (tally.target_calls, tally.draft_calls) == (2, 2)
