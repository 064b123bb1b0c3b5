"""The RowLinear twin (specdec.row_linear, the `row_linear` setting): the same products as the model's
linear layers, the model itself untouched, Hugging Face's recorded outputs and a forward meter's
hooks working through it, and greedy output identical to generate(do_sample=False) with it on."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import specdec.row_linear as row_linear_module
from conftest import hf_greedy, noisy_copy, tiny_model
from specdec import Speculator
from specdec.costmodel import profile_key
from specdec.row_linear import RowLinear, row_twin
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.prompt_lookup import PromptLookup

N = 24
PROMPT = [5, 17, 33, 9, 41, 5, 17, 33, 9, 41, 60, 70, 5, 17]
# a tiny model with this vocabulary has one large weight, its output layer (4096 x 32 = CACHED_WEIGHT)
LARGE_VOCAB = 4096


@pytest.fixture
def pad_every_row(monkeypatch):
    """The tiny models' layers are twinned, and every forward of at most 8 rows takes the weight @ input.T
    path, one row (padded) included: their weights are far below CACHED_WEIGHT, the size a layer must
    have to be twinned at all."""
    monkeypatch.setattr(row_linear_module, "CACHED_WEIGHT", 0)


@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
def test_row_linear_computes_the_linear_product(pad_every_row, rows, bias, batched):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 64, bias=bias)
    twin = row_twin(layer)
    assert type(twin) is RowLinear and twin.weight is layer.weight
    x = torch.randn(1, rows, 48) if batched else torch.randn(rows, 48)
    out = twin(x)
    assert out.shape == layer(x).shape and out.is_contiguous()
    torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)


def test_cached_weights_are_not_twinned():
    """A weight small enough to stay in a core's cache keeps PyTorch's own product: a model of such
    layers has no twin, and in a model with both only the large layers are twinned."""
    small = nn.Linear(16, 8)
    assert small.weight.numel() < row_linear_module.CACHED_WEIGHT
    assert row_twin(small) is None
    assert row_twin(tiny_model("llama")) is None                 # every weight of the tiny model is small
    side = math.isqrt(row_linear_module.CACHED_WEIGHT - 1) + 1
    mixed = nn.Sequential(nn.Linear(side, side), nn.Linear(side, 8))     # side x side >= CACHED_WEIGHT: large
    twin = row_twin(mixed)
    assert [type(m) for m in twin] == [RowLinear, nn.Linear]
    x = torch.randn(1, 3, side)
    torch.testing.assert_close(twin(x), mixed(x), rtol=1e-5, atol=1e-5)


def test_twin_shares_weights_and_leaves_the_model_alone(pad_every_row):
    model = tiny_model("llama", seed=3)
    ids = torch.tensor([PROMPT])
    before = model(ids).logits
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    twin = row_twin(model)
    assert twin is not None and twin is not model
    assert [name for name, m in model.named_modules() if type(m) is nn.Linear] == linears     # none swapped
    assert not any(isinstance(m, RowLinear) for m in model.modules())
    assert sum(isinstance(m, RowLinear) for m in twin.modules()) == len(linears)
    twin_params = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        assert twin_params[name] is p                                   # the same tensors, nothing copied
    assert torch.equal(model(ids).logits, before)
    torch.testing.assert_close(twin(ids).logits, before, rtol=1e-4, atol=1e-5)


def test_only_float32_cpu_nn_linear_layers_are_twinned(monkeypatch):
    assert row_twin(tiny_model("llama", vocab=LARGE_VOCAB).to(torch.bfloat16), pack=False) is None
    monkeypatch.setattr(row_linear_module, "CACHED_WEIGHT", 0)
    gpt2 = row_twin(tiny_model("gpt2"))           # its blocks' projections are Conv1D: they keep their forward
    assert [name for name, m in gpt2.named_modules() if isinstance(m, RowLinear)] == ["lm_head"]


@pytest.mark.parametrize("twin_first", [True, False])
def test_recorded_hidden_states_once_through_either(pad_every_row, twin_first):
    """Hugging Face installs its output-recording hooks in the layers a model calls, once per model:
    the twin's layers have registries of their own, so neither call order records a layer twice."""
    model = tiny_model("llama", seed=4)
    twin = row_twin(model)
    ids = torch.tensor([PROMPT])
    first, second = (twin, model) if twin_first else (model, twin)
    counts = [len(m(ids, output_hidden_states=True).hidden_states) for m in (first, second, first)]
    assert counts == [model.config.num_hidden_layers + 1] * 3


def test_hooks_on_the_model_see_the_twins_forwards(pad_every_row):
    model = tiny_model("llama", seed=5)
    twin = row_twin(model)
    seen = []
    handle = model.register_forward_hook(lambda module, args, out: seen.append(1))    # after the twin was made
    twin(torch.tensor([PROMPT]))
    handle.remove()
    assert seen == [1]


def _generate(target, strategy, rows: int) -> list[int]:
    sd = Speculator(target, None, strategy, row_linear=rows)
    assert (sd.verifier.row_model is not None) == (rows > 0)
    return sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids


@pytest.mark.parametrize("strategy", ["autoregressive", "prompt_lookup", "draft_model"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_identity_with_row_linear(pad_every_row, strategy, arch):
    target = tiny_model(arch, seed=0)
    make = {"autoregressive": Autoregressive,
            "prompt_lookup": lambda: PromptLookup(max_ngram=3, num_tokens=5),
            "draft_model": lambda: DraftModel(noisy_copy(target), num_tokens=4)}[strategy]
    reference = hf_greedy(target, PROMPT, N, eos_token_id=None)
    assert _generate(target, make(), 64) == reference         # every verify forward through the twin
    assert _generate(target, make(), 3) == reference          # the two paths by tree size


def test_planners_are_told_the_setting():
    told = []

    class Spy(Autoregressive):
        def use_row_linear(self, rows: int) -> None:
            told.append(rows)

    Speculator(tiny_model("llama", vocab=LARGE_VOCAB), None, Spy(), row_linear=8)
    Speculator(tiny_model("llama"), None, Spy(), row_linear=8)      # no large weight, no twin: nothing to time
    Speculator(tiny_model("llama", vocab=LARGE_VOCAB), None, Spy(), row_linear=0)
    assert told == [8, 0, 0]


def test_auto_tells_its_drafter():
    """A drafter that plans on its own cost profile inside auto (token_recycling) times the verifier's
    forwards, not the stock layers'."""
    from specdec.strategies.auto import Auto
    from specdec.strategies.token_recycling import TokenRecycling
    told = []

    class Spy(TokenRecycling):
        def use_row_linear(self, rows: int) -> None:
            told.append(("rows", rows))

        def use_compiled_verifier(self, compiled: bool) -> None:
            told.append(("compiled", compiled))

    auto = Auto(drafter=Spy(profile=False))
    auto.use_compiled_verifier(False)
    auto.use_row_linear(8)
    assert told == [("compiled", False), ("rows", 8)]
    assert auto.row_linear == 8


def test_profiles_with_and_without_row_linear_are_kept_apart():
    target = tiny_model("llama")
    plain = profile_key(target, (0, 1, 2), 64)
    assert profile_key(target, (0, 1, 2), 64, row_linear=0) == plain        # keys on disk stay valid
    assert profile_key(target, (0, 1, 2), 64, row_linear=8) not in (plain, profile_key(target, (0, 1, 2), 64,
                                                                                         row_linear=16))


def test_the_config_default_is_the_engines():
    from specdec.config import EngineConfig
    from specdec.verifier import ROW_LINEAR
    assert EngineConfig().row_linear == ROW_LINEAR
    assert Speculator(tiny_model("llama", vocab=LARGE_VOCAB), None, Autoregressive()).verifier.row_linear == ROW_LINEAR


@pytest.mark.parametrize("strategy", ["autoregressive", "prompt_lookup"])
def test_batched_greedy_identity_with_row_linear(pad_every_row, strategy):
    """A batch's forwards of at most row_linear rows in all go through the twin too: a batch of 2
    plain rows (2 rows) and small trees take it, wide trees do not, and every row is still greedy's."""
    target = tiny_model("llama", seed=0)
    prompts = [PROMPT, [9, 8, 7, 9, 8, 7, 9, 8], [3, 4, 5, 6]]
    make = {"autoregressive": Autoregressive, "prompt_lookup": lambda: PromptLookup(max_ngram=3, num_tokens=3)}[strategy]
    sd = Speculator(target, None, make(), row_linear=8)
    used = []
    forward = type(sd.verifier.row_model).forward
    sd.verifier.row_model.forward = lambda *a, **k: used.append(1) or forward(sd.verifier.row_model, *a, **k)
    outs = sd.generate(prompts, max_new_tokens=[N, N - 5, N], ignore_eos=True, batch_size=2)
    assert [out.token_ids for out in outs] == [hf_greedy(target, p, n, eos_token_id=None)
                                             for p, n in zip(prompts, [N, N - 5, N])]
    assert used                                          # the batch's small forwards ran through the twin


def test_batched_profiles_with_and_without_row_linear_are_kept_apart():
    target = tiny_model("llama")
    assert profile_key(target, (0, 1), 64, batch=4, row_linear=8) != profile_key(target, (0, 1), 64, batch=4)
