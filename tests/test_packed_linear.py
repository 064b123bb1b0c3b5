"""Packed linear weights (specdec.row_linear, the `packed_linear` setting): oneDNN's kernel on a packed
copy computes the layer's product, the copy follows the weight, training never runs through it, it
is made only where it fits in memory, EAGLE drafters and twins of the target get it while the
target's own layers never change, and greedy output stays identical to generate(do_sample=False)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import specdec.row_linear as row_linear_module
from conftest import hf_greedy, noisy_copy, tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.config import EngineConfig
from specdec.costmodel import profile_key
from specdec.row_linear import RowLinear, can_pack, pack_layers, packed_group, packed_weight, row_twin, set_packing
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.eagle import Eagle
from specdec.strategies.prompt_lookup import PromptLookup

pytestmark = pytest.mark.skipif(not can_pack(torch.float32), reason="this PyTorch has no oneDNN")

N = 24
PROMPT = [5, 17, 33, 9, 41, 5, 17, 33, 9, 41, 60, 70, 5, 17]


@pytest.fixture(autouse=True)
def pack_every_layer(monkeypatch):
    """Every layer of the tiny models counts as large (they are far below the size that packs), and
    the setting is restored whatever a test sets."""
    monkeypatch.setattr(row_linear_module, "CACHED_WEIGHT", 0)
    yield
    set_packing(True)


def packed_layers(module: nn.Module) -> list[RowLinear]:
    return [m for m in module.modules() if isinstance(m, RowLinear) and m.packed]


@pytest.mark.parametrize("rows", [1, 2, 3, 9, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_layer_computes_the_linear_product(rows, dtype, bias):
    if not can_pack(dtype):
        pytest.skip(f"oneDNN does not run {dtype} natively on this CPU")
    torch.manual_seed(rows)
    layer = nn.Linear(48, 64, bias=bias).to(dtype)
    twin = row_twin(layer)
    assert type(twin) is RowLinear and twin.packed and twin.weight is layer.weight
    x = torch.randn(1, rows, 48, dtype=dtype)
    out = twin(x)
    assert out.shape == (1, rows, 64) and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, layer(x), rtol=tolerance, atol=tolerance)


def test_bfloat16_layers_are_twinned_only_where_they_pack():
    model = tiny_model("llama").to(torch.bfloat16)
    if can_pack(torch.bfloat16):
        assert len(packed_layers(row_twin(model))) == sum(type(m) is nn.Linear for m in model.modules())
    assert row_twin(model, pack=False) is None             # PyTorch's own bf16 product beats weight @ x.T


def test_the_packed_copy_follows_the_weight_and_is_shared():
    torch.manual_seed(0)
    layer = nn.Linear(32, 16)
    first, second = row_twin(layer), row_twin(layer)
    x = torch.randn(5, 32)
    assert first._held[1] is second._held[1] is packed_weight(layer.weight)[1]     # one copy for both twins
    with torch.no_grad():
        layer.weight.mul_(-2.0)                                         # in place: its version moves
    for twin in (first, second):
        torch.testing.assert_close(twin(x), layer(x), rtol=1e-5, atol=1e-5)


def test_a_layer_being_trained_never_runs_through_the_copy():
    torch.manual_seed(0)
    layer = nn.Linear(32, 16)
    twin = row_twin(layer)
    x = torch.randn(5, 32)
    twin(x).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(16, 32))


def test_no_packing_where_it_does_not_fit_in_memory(monkeypatch):
    model = tiny_model("llama")
    weights = sum(m.weight.nbytes for m in model.modules() if type(m) is nn.Linear)
    monkeypatch.setattr(row_linear_module, "free_memory", lambda: weights)     # a quarter is too little
    twin = row_twin(model)
    assert twin is not None and not packed_layers(twin)                # float32: the unpacked kernels
    assert row_twin(model.to(torch.bfloat16)) is None                  # bfloat16: nothing to gain
    monkeypatch.setattr(row_linear_module, "free_memory", lambda: 8 * weights)
    assert packed_layers(row_twin(model.float()))


def test_the_setting_turns_packing_off_and_keys_profiles():
    target = tiny_model("llama")
    packed_key = profile_key(target, (0, 1, 2), 64, row_linear=8)
    sd = Speculator(target, None, Autoregressive(), config=_config(packed_linear=False, row_linear=8))
    assert sd.verifier.row_model is not None and not packed_layers(sd.verifier.row_model)
    unpacked_key = profile_key(target, (0, 1, 2), 64, row_linear=8)
    assert unpacked_key != packed_key
    sd = Speculator(target, None, Autoregressive(), config=_config(row_linear=8))
    assert packed_layers(sd.verifier.row_model)
    assert profile_key(target, (0, 1, 2), 64, row_linear=8) == packed_key


def _config(**engine):
    from specdec.config import load_spec_config
    return load_spec_config("autoregressive", [f"{key}={str(value).lower()}" for key, value in engine.items()])


def test_eagle_drafter_layers_pack_and_the_target_stays_as_it_was():
    target = tiny_model("llama", seed=2)
    before = {name: type(m) for name, m in target.named_modules()}
    drafter = random_drafter(target)
    Speculator(target, None, Eagle(drafter, max_nodes=6))
    assert {name: type(m) for name, m in target.named_modules()} == before
    drafter_linears = [m for m in drafter.modules() if isinstance(m, nn.Linear)]
    assert drafter_linears and all(isinstance(m, RowLinear) and m.packed for m in drafter_linears)
    head = drafter._shared_lm_head[0]
    assert isinstance(head, RowLinear) and head.packed and head is not target.get_output_embeddings()
    set_packing(False)
    assert pack_layers(drafter) == 0 and not any(isinstance(m, RowLinear) for m in drafter.modules())


@pytest.mark.parametrize("strategy", ["autoregressive", "prompt_lookup", "draft_model", "eagle"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_identity_with_packed_weights(strategy, arch):
    target = tiny_model(arch, seed=0)
    make = {"autoregressive": Autoregressive,
            "prompt_lookup": lambda: PromptLookup(max_ngram=3, num_tokens=5),
            "draft_model": lambda: DraftModel(noisy_copy(target), num_tokens=4),
            "eagle": lambda: Eagle(random_drafter(target, seed=3), max_nodes=6)}[strategy]
    sd = Speculator(target, None, make(), row_linear=64)
    assert packed_layers(sd.verifier.row_model)
    assert sd.generate(PROMPT, max_new_tokens=N, ignore_eos=True).token_ids == hf_greedy(target, PROMPT, N,
                                                                                       eos_token_id=None)


def test_batched_greedy_identity_with_packed_weights():
    target = tiny_model("llama", seed=0)
    prompts = [PROMPT, [9, 8, 7, 9, 8, 7, 9, 8], [3, 4, 5, 6]]
    sd = Speculator(target, None, PromptLookup(max_ngram=3, num_tokens=3), row_linear=64)
    outs = sd.generate(prompts, max_new_tokens=[N, N - 5, N], ignore_eos=True, batch_size=3)
    assert [out.token_ids for out in outs] == [hf_greedy(target, p, n, eos_token_id=None)
                                             for p, n in zip(prompts, [N, N - 5, N])]


def test_the_config_default_packs():
    assert EngineConfig().packed_linear is True


def test_weights_made_in_inference_mode_pack():
    with torch.inference_mode():
        layer = nn.Linear(32, 16)
        x = torch.randn(5, 32)
        twin = row_twin(layer)
        assert twin.packed
        torch.testing.assert_close(twin(x), layer(x), rtol=1e-5, atol=1e-5)


def test_a_weight_moved_to_another_dtype_is_packed_again():
    """Module.to() swaps a Parameter's storage without moving its version counter: the copy follows."""
    torch.manual_seed(0)
    layer = nn.Linear(32, 16)
    assert pack_layers(layer) == 1
    x = torch.randn(5, 32)
    layer(x)
    layer.float().to(torch.float64).to(torch.float32)
    with torch.no_grad():
        layer.weight.data = torch.randn(16, 32)
    torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    if can_pack(torch.bfloat16):
        layer.to(torch.bfloat16)
        out = layer(x.bfloat16())
        torch.testing.assert_close(out, nn.functional.linear(x.bfloat16(), layer.weight, layer.bias),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("packed", [True, False])
def test_with_packed_weights_every_forward_takes_the_twin(packed):
    """The prefill (14 rows, above row_linear's 8) takes the twin only where its weights are packed."""
    target = tiny_model("llama", seed=0)
    sd = Speculator(target, None, Autoregressive(), config=_config(packed_linear=packed))
    rows = []
    twin = sd.verifier.row_model
    forward = type(twin).forward
    twin.forward = lambda *a, **k: rows.append(k["input_ids"].shape[1]) or forward(twin, *a, **k)
    assert sd.generate(PROMPT, max_new_tokens=4, ignore_eos=True).token_ids == hf_greedy(target, PROMPT, 4,
                                                                                      eos_token_id=None)
    decode = [n for n in rows if n == 1]
    assert decode and rows == ([len(PROMPT) - 1] if packed else []) + decode


def test_a_drafter_moved_off_the_cpu_or_unpacked_holds_no_packed_layer():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8))
    assert pack_layers(block) == 2 and all(type(m) is RowLinear for m in block)
    block(torch.randn(3, 32))
    set_packing(False)
    assert pack_layers(block) == 0
    assert all(type(m) is nn.Linear and "packed" not in vars(m) and "_held" not in vars(m) for m in block)
    set_packing(True)
    assert pack_layers(block.to("meta")) == 0 and all(type(m) is nn.Linear for m in block)


def _drafter_outputs(packed: bool):
    target = tiny_model("llama", seed=2)
    drafter = random_drafter(target, seed=5)
    Speculator(target, None, Eagle(drafter, max_nodes=6),               # binds it (float32, the target's)
               config=_config(packed_linear=packed))
    torch.manual_seed(9)
    g, tokens = torch.randn(1, 5, 32), torch.randint(3, 90, (1, 5))
    with torch.inference_mode():
        out, logits, k, v = drafter(g, tokens, torch.arange(5)[None])
    return drafter, (out, logits, k, v)


def test_a_packed_drafter_computes_what_the_unpacked_one_does():
    """q/k/v and gate/up as one product each (PackedGroup) and every layer packed: the same outputs,
    keys and values as the drafter's own layers."""
    packed, got = _drafter_outputs(True)
    plain, expected = _drafter_outputs(False)
    assert packed.block._qkv is not None and packed.block._gate_up is not None
    assert not plain.block._qkv.packed and not any(isinstance(m, RowLinear) for m in plain.modules())
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("packed", [True, False])
def test_a_drafters_cached_forward_computes_what_its_layers_do(packed):
    """The cached forward (q/k/v and gate/up as one product each, packed or stacked; q and k rotated
    together from the kept rotary table) against the block's own pass, layer by layer: the same
    outputs, keys and values, over a prompt longer than the table's first size and then a tree level
    whose rows see part of it."""
    import copy
    from specdec.cache import BufferedLayer
    fused, _ = _drafter_outputs(packed)
    layered = copy.deepcopy(fused)
    layered.block._qkv = layered.block._gate_up = None
    torch.manual_seed(3)
    prompt = 1100
    g, tokens = torch.randn(1, prompt, 32), torch.randint(3, 90, (1, prompt))
    level_g, level_tokens = torch.randn(1, 3, 32), torch.randint(3, 90, (1, 3))
    level_positions = torch.tensor([[prompt, prompt + 1, prompt + 1]])
    visible = torch.ones(1, 3, prompt + 3, dtype=torch.bool)
    visible[0, :, prompt:] = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
    visible[0, 2, :5] = False
    runs = []
    with torch.inference_mode():
        for drafter in (fused, layered):
            cache = BufferedLayer()
            first = drafter(g, tokens, torch.arange(prompt)[None], cache=cache, start=0)
            level = drafter(level_g, level_tokens, level_positions, visible=visible, cache=cache, start=prompt)
            runs.append((*first, *level, cache.keys, cache.values))
    for got, expected in zip(*runs):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_packed_drafter_copies_and_its_groups_follow_their_weights():
    import copy
    drafter, (out, _, _, _) = _drafter_outputs(True)
    clone = copy.deepcopy(drafter)                                  # oneDNN's layout is not copied
    torch.manual_seed(9)
    g, tokens = torch.randn(1, 5, 32), torch.randint(3, 90, (1, 5))
    with torch.inference_mode():
        torch.testing.assert_close(clone(g, tokens, torch.arange(5)[None])[0], out, rtol=1e-5, atol=1e-6)
        drafter.block.k_proj.weight.mul_(3.0)                       # in place: the group's copy follows
        changed = drafter(g, tokens, torch.arange(5)[None])[2]
    set_packing(False)
    pack_layers(clone)
    clone.block.group_projections()
    with torch.no_grad():
        clone.block.k_proj.weight.mul_(3.0)
    with torch.inference_mode():
        torch.testing.assert_close(changed, clone(g, tokens, torch.arange(5)[None])[2], rtol=1e-4, atol=1e-5)


def test_gradients_reach_the_input_of_a_frozen_packed_layer():
    torch.manual_seed(0)
    layer = nn.Linear(32, 16).requires_grad_(False)
    twin = row_twin(layer)
    x = torch.randn(5, 32, requires_grad=True)
    twin(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(5, 32))


def test_a_layer_moved_off_the_cpu_runs_its_own_product():
    twin = row_twin(nn.Linear(32, 16))
    assert twin.packed
    twin.to("meta")
    assert twin(torch.randn(5, 32, device="meta")).shape == (5, 16)


def test_profiles_are_keyed_unpacked_where_packing_does_not_fit(monkeypatch):
    target = tiny_model("llama")
    set_packing(False)
    unpacked = profile_key(target, (0, 1, 2), 64, row_linear=8)
    set_packing(True)
    assert profile_key(target, (0, 1, 2), 64, row_linear=8) != unpacked
    monkeypatch.setattr(row_linear_module, "free_memory", lambda: 1)
    assert profile_key(target, (0, 1, 2), 64, row_linear=8) == unpacked
    assert not packed_layers(Speculator(target, None, Autoregressive(), row_linear=8).verifier.row_model)


def test_a_packed_copy_lives_as_long_as_a_layer_holds_it():
    import gc
    layer = nn.Linear(32, 16)
    twin = row_twin(layer)
    copy_ref = row_linear_module._PACKED[layer.weight][1]
    assert copy_ref() is twin._held[1]
    del twin
    gc.collect()
    assert copy_ref() is None                                      # the user's layer keeps no copy alive


def test_a_group_moved_off_the_cpu_runs_each_layer():
    layers = [nn.Linear(32, 16), nn.Linear(32, 8)]
    for layer in layers:
        pack_layers(layer)
    group = packed_group(layers)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert [part.shape for part in group(x)] == [(3, 16), (3, 8)] and group._held is not None
        for layer in layers:
            layer.to("meta")
        assert [part.shape for part in group(torch.randn(3, 32, device="meta"))] == [(3, 16), (3, 8)]
    assert group._held is None
