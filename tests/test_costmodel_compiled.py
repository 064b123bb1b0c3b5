"""`auto`'s cost profile times the verifier the steps run: with `compile: true`, the
compiled static-shape forward (specdec.compiled), not the eager one, under a profile key of its own.

torch.compile itself is replaced by the identity here (inductor on CPU takes tens of seconds per
graph, and whether it compiles is test_compile.py's subject): the spies check which forward the
profile runs - StaticForward.run, through its compiled branch, one bucket per tree size."""
from __future__ import annotations

import torch

from conftest import tiny_model
from specdec import Speculator, costmodel
from specdec.compiled import StaticForward, bucket_rows
from specdec.strategies.auto import Auto
from specdec.strategies.prompt_lookup import PromptLookup
from specdec.verifier import ROW_LINEAR, Verifier

TARGET = tiny_model("llama", seed=3)
MAX_NODES = 4


def profiled_forwards(monkeypatch, tmp_path, compile: bool):
    """(auto's profile, rows of every StaticForward.run, buckets run compiled, eager verify forwards)
    while Speculator(..., compile=compile) binds auto (which measures its profile)."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    static_rows, compiled_buckets, eager = [], set(), []
    real_run, real_forward = StaticForward.run, Verifier.forward

    def spied_run(self, input_ids, *args, **kwargs):
        static_rows.append(input_ids.shape[1])
        out = real_run(self, input_ids, *args, **kwargs)
        compiled_buckets.update(self.compiled_rows)
        return out

    def spied_forward(self, *args, **kwargs):
        if self.static is None:
            eager.append(1)
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(StaticForward, "run", spied_run)
    monkeypatch.setattr(Verifier, "forward", spied_forward)
    strategy = Auto(PromptLookup(), None, profile=True, profile_context=8, max_nodes=MAX_NODES, profile_repeats=1)
    Speculator(TARGET, None, strategy, compile=compile)
    return strategy.costs, static_rows, compiled_buckets, eager


def test_auto_profiles_the_compiled_verifier(monkeypatch, tmp_path):
    costs, static_rows, compiled_buckets, eager = profiled_forwards(monkeypatch, tmp_path, compile=True)
    assert costs.sizes == tuple(range(MAX_NODES + 1))
    assert not eager, "the profile timed the eager verifier, not the compiled one the steps run"
    # every tree size went through the static forward, [pending] + n rows, in its compiled bucket
    assert {1 + n for n in costs.sizes} <= set(static_rows)
    assert {bucket_rows(1 + n) for n in costs.sizes} <= compiled_buckets
    assert costs.key == costmodel.profile_key(TARGET, costs.sizes, costs.context_len, compile=True)


def test_eager_auto_profiles_the_eager_verifier(monkeypatch, tmp_path):
    """The control: without compile the profile runs the eager forward, under the eager key (so a
    compiled profile on disk is never read for an eager Speculator, nor the other way round)."""
    costs, static_rows, _, eager = profiled_forwards(monkeypatch, tmp_path, compile=False)
    assert not static_rows and eager
    # the tiny target's weights all stay in a core's cache: no RowLinear twin, so row_linear 0
    assert Verifier(TARGET, row_linear=ROW_LINEAR).row_linear == 0
    assert costs.key == costmodel.profile_key(TARGET, costs.sizes, costs.context_len, row_linear=0)
    assert costs.key != costmodel.profile_key(TARGET, costs.sizes, costs.context_len, compile=True)
