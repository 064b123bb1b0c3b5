"""Int8 drafter weights (specdec/int8_linear.py): the product they compute, their groups, the swap, and a
drafter whose layers hold them computing what its float layers do, within the rounding of int8."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import tiny_model
from eagle_helpers import random_drafter
from specdec.api import Speculator
from specdec.cache import BufferedLayer
from specdec.int8_linear import Int8Group, Int8Linear, int8_supported, linear_group, quantize_linears
from specdec.row_linear import RowLinear, pack_layers
from specdec.strategies.eagle import Eagle

pytestmark = pytest.mark.skipif(not int8_supported(torch.device("cpu")), reason="this torch has no CPU int8 weight kernel")


def test_an_int8_layer_computes_its_float_product_within_the_rounding():
    torch.manual_seed(0)
    layer = nn.Linear(64, 48, bias=True)
    quantized = Int8Linear.of(layer)
    assert quantized.weight.dtype == torch.int8 and quantized.weight.abs().max() == 127    # each row's largest is +-127
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        expected = layer(x)
        got = quantized(x)                                                     # float32 in: cast to bfloat16
    assert got.shape == (2, 5, 48) and got.dtype == torch.bfloat16
    # int8 rounding (<= half a step of each row's scale per weight) and bfloat16 inputs: a few percent
    error = (got.float() - expected).norm() / expected.norm()
    assert error < 0.03
    # rows of zeros stay finite (a scale of zero would divide by it)
    zero = nn.Linear(32, 4, bias=False)
    nn.init.zeros_(zero.weight)
    assert torch.equal(Int8Linear.of(zero)(torch.ones(3, 32)).float(), torch.zeros(3, 4))
    # the kernel reads inputs in chunks of 32 with no tail: a narrower layer is refused, and left as it is
    with pytest.raises(ValueError, match="divisible by 32"):
        Int8Linear.of(nn.Linear(24, 4))
    narrow = nn.Sequential(nn.Linear(24, 32), nn.Linear(32, 8))
    assert quantize_linears(narrow) == 1 and type(narrow[0]) is nn.Linear and isinstance(narrow[1], Int8Linear)


def test_a_group_computes_its_layers_side_by_side():
    torch.manual_seed(1)
    layers = [Int8Linear.of(nn.Linear(32, n, bias=False)) for n in (32, 16, 16)]
    group = linear_group(layers)
    assert isinstance(group, Int8Group)
    x = torch.randn(1, 4, 32, dtype=torch.bfloat16)
    fused = group.fused(x)
    assert fused.shape == (1, 4, 64)
    for part, layer in zip(group(x), layers):
        torch.testing.assert_close(part, layer(x), rtol=0, atol=0)
    # float layers are not grouped here: row_linear's groups take them
    assert not isinstance(linear_group([nn.Linear(32, 8), nn.Linear(32, 8)]), Int8Group)


def test_the_swap_replaces_every_linear_layer_packed_ones_included(monkeypatch):
    from specdec import row_linear
    monkeypatch.setattr(row_linear, "CACHED_WEIGHT", 0)          # tiny layers count as large: they pack
    block = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 8)))
    pack_layers(block)
    assert isinstance(block[0], RowLinear) and block[0].packed
    assert quantize_linears(block) == 2
    assert isinstance(block[0], Int8Linear) and isinstance(block[2][0], Int8Linear)
    assert not any(isinstance(m, nn.Linear) for m in block.modules())


def test_an_int8_drafter_computes_what_its_float_layers_do():
    """The drafter bound with int8 weights (its cached forward running q/k/v and gate/up as one int8 product
    each) against the same drafter in float32: outputs, logits and the cache agree within int8 rounding, and
    its top token agrees almost everywhere."""
    target = tiny_model("llama", seed=2)
    drafter = random_drafter(target, seed=5)
    float_drafter = copy.deepcopy(drafter)
    Speculator(target, None, Eagle(drafter, max_nodes=6, dtype="int8"))
    Speculator(target, None, Eagle(float_drafter, max_nodes=6, dtype="float32"))
    assert isinstance(drafter.block._qkv, Int8Group) and isinstance(drafter.block._gate_up, Int8Group)
    torch.manual_seed(3)
    prompt = 40
    g, tokens = torch.randn(1, prompt, 32), torch.randint(3, 90, (1, prompt))
    runs = []
    with torch.inference_mode():
        for one, dtype in ((drafter, torch.bfloat16), (float_drafter, torch.float32)):
            cache = BufferedLayer()
            out, logits, _, _ = one(g.to(dtype), tokens, torch.arange(prompt)[None], cache=cache, start=0)
            runs.append((out.float(), logits.float(), cache.keys.float()))
    for got, expected in zip(*runs):
        assert (got - expected).norm() / expected.norm() < 0.05
    int8_logits, float_logits = runs[0][1], runs[1][1]
    assert (int8_logits.argmax(-1) == float_logits.argmax(-1)).float().mean() >= 0.9
