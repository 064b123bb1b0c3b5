"""Every causal-LM architecture the installed transformers builds: prompt lookup, a draft chain and
a draft tree are token-identical to HF greedy generate in fp32, or refused by specdec with a clear
error (scripts/measure/arch_sweep.py; the whole sweep is slow-marked, a few representatives of
each outcome run by default)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "measure"))
import arch_sweep  # noqa: E402

from specdec import Speculator  # noqa: E402
from specdec.errors import IncompatibleModelsError  # noqa: E402
from specdec.strategies.autoregressive import Autoregressive  # noqa: E402

# Architectures that specdec still verifies wrong (known, reported in the sweep's table): none now.
KNOWN_FAILURES: dict[str, str] = {}


def assert_identical_or_refused(arch: str) -> arch_sweep.Row:
    row = arch_sweep.check(arch)
    assert not row.failed, f"{arch}: {row.note}"
    for cell in row.cells.values():
        assert cell in ("identical", "refused", "skipped"), (arch, row.cells)
    if "refused" in row.cells.values():
        assert "IncompatibleModelsError" in row.note or "ModelLoadError" in row.note, row.note
    return row


@pytest.mark.slow
@pytest.mark.parametrize("arch", arch_sweep.architectures())
def test_every_architecture_identical_or_refused(arch):
    if arch in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[arch])
    assert_identical_or_refused(arch)


@pytest.mark.parametrize("arch, verdict", [
    ("deepseek_v3", "identical"),    # latent attention: keys wider than values in one KV buffer
    ("roberta", "identical"),        # positions derived from input ids unless given, as generate() gives them
    ("bert", "identical"),           # an encoder loaded as a decoder (is_decoder=True)
    ("gemma2", "identical"),         # sliding and full layers
    ("bloom", "refused"),            # ALiBi built from a 2-D mask: a 4-D tree mask raises inside it
    ("mpt", "refused"),              # ALiBi by key index: a tree forward is silently wrong
    ("moshi", "refused"),            # its window lives in HF's cache alone, not in its mask
])
def test_representatives(arch, verdict):
    row = assert_identical_or_refused(arch)
    assert set(row.cells.values()) == {verdict}, (row.cells, row.note)
    if verdict == "identical":
        assert "drafted tokens accepted" in row.note and not row.note.startswith("draft tree: 0 ")


@pytest.mark.parametrize("arch", ["mamba", "qwen3_next", "qwen3_5"])
def test_recurrent_targets_verify_chains(arch):
    """A recurrent state (Mamba; Qwen3-Next's linear-attention layers beside full attention): prompt
    lookup's chains identical on the target; as a draft (whose cache specdec commits per path) refused."""
    row = assert_identical_or_refused(arch)
    assert row.cells == {"prompt_lookup": "identical", "draft chain": "refused", "draft tree": "refused"}, row.cells
    assert "the draft model" in row.note, row.note


def test_encoder_without_is_decoder_refused():
    """BERT with a causal-LM head but is_decoder=False attends both ways: refused, saying how to load it."""
    config = arch_sweep.tiny_config("bert")
    config.is_decoder = False
    target = arch_sweep.build(config)
    with pytest.raises(IncompatibleModelsError, match="is_decoder=True"):
        Speculator(target, None, Autoregressive())


def test_tree_probe_catches_a_model_that_ignores_the_mask(monkeypatch):
    """Negative control of the load-time tree probe: a Llama whose attention drops the 4-D mask
    (every row then sees every key) is refused."""
    from transformers.models.llama import modeling_llama
    target = arch_sweep.build(arch_sweep.tiny_config("llama"))
    Speculator(target, None, Autoregressive())                     # precondition: accepted as it is
    forward = modeling_llama.LlamaAttention.forward

    def unmasked(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        return forward(self, hidden_states, position_embeddings, None, **kwargs)
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", unmasked)
    with pytest.raises(IncompatibleModelsError, match="ignores the mask or the positions"):
        Speculator(target, None, Autoregressive())


def test_latent_attention_cache_holds_keys_and_values():
    """Keys wider than values: the cache returns exactly what concatenation would, and a commit
    moves both."""
    from specdec.cache import BufferedLayer
    layer = BufferedLayer(capacity=16)
    keys, values = torch.randn(1, 2, 5, 12), torch.randn(1, 2, 5, 8)        # [B, heads, rows, dim]
    layer.update(keys[:, :, :3], values[:, :, :3])
    got_keys, got_values = layer.update(keys[:, :, 3:], values[:, :, 3:])
    torch.testing.assert_close(got_keys, keys)
    torch.testing.assert_close(got_values, values)
    layer.keep(2, torch.tensor([4]), 3)                       # keep row 4 right after a prefix of 2
    torch.testing.assert_close(layer.keys, torch.cat([keys[:, :, :2], keys[:, :, 4:5]], dim=2))
    torch.testing.assert_close(layer.values, torch.cat([values[:, :, :2], values[:, :, 4:5]], dim=2))
