"""Conformance with speculators 0.9.0 (vLLM's EAGLE-3 format), against its own code in a side
environment (scripts/interop/speculators_env.sh):

* ours -> theirs: `specdec export eagle --format speculators` is loaded by speculators'
  `SpeculatorModelConfig.from_pretrained` + `SpeculatorModel.from_pretrained`, and its forward
  on the same target hidden states drafts what our drafter drafts;
* theirs -> ours: an EAGLE-3 speculator that speculators builds and saves with its own API loads
  into our `eagle` and drafts what speculators' forward predicts.

"The same" is checked at every position of every training-time-test step of speculators' forward
(step k: the previous step's output fed back, the ids shifted by k, positions + k, each row seeing
the step-0 rows up to itself and its own rows of steps 1..k - what a depth-k chain node sees at
inference): equal draft argmax everywhere, logits within 1e-4."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import char_tokenizer, tiny_model
from eagle_helpers import random_drafter
from speculators_env import side, side_python  # noqa: F401 - a fixture
from specdec.heads.eagle3 import Eagle3Drafter
from specdec.heads.eagle_io import load_eagle
from specdec.heads.eagle_formats import export_eagle3
from specdec.models import load_model

pytestmark = pytest.mark.slow
STEPS, SEQ = 4, 12


@torch.no_grad()
def our_ttt_logits(drafter, hidden: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Our drafter run as speculators' forward runs: per step, [n, N] draft-vocabulary logits."""
    n = input_ids.shape[1]
    g = drafter.input_features(hidden)                                   # [1, n, H]
    positions = torch.arange(n)[None]
    row, col = torch.arange(n)[:, None], torch.arange(n)[None]
    past_k = past_v = None
    logits = []
    for k in range(steps):
        tokens = torch.cat([input_ids[:, k:], input_ids.new_zeros(1, k)], dim=1)
        visible = torch.cat([col <= row] + [col == row] * k, dim=1)[None]   # [1, n, (k + 1) n]
        out, _, key, value = drafter(g, tokens, positions + k, past_k, past_v, visible, with_logits=False)
        logits.append(drafter.draft_logits(out)[0])
        past_k = key if past_k is None else torch.cat([past_k, key], dim=2)
        past_v = value if past_v is None else torch.cat([past_v, value], dim=2)
        g = out
    return logits


def their_ttt_logits(python, model_dir, hidden, input_ids, tmp_path, steps=STEPS) -> list[torch.Tensor]:
    inputs, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"hidden_states": hidden.contiguous(), "input_ids": input_ids.contiguous()}, str(inputs))
    summary = side(python, "forward", "--model", str(model_dir), "--inputs", str(inputs), "--out", str(out),
                   "--steps", str(steps))
    assert summary["speculators"] == "0.9.0" and summary["argmax_is_tokens"]
    result = load_file(str(out))
    return [result[f"logits_{k}"] for k in range(steps)]


def assert_same_drafts(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, (k, a.shape, b.shape)
        assert torch.equal(a.argmax(-1), b.argmax(-1)), f"step {k}: draft tokens differ"
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"step {k}")


def random_inputs(hidden_size: int, features: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, SEQ, features * hidden_size, generator=gen),
            torch.randint(0, vocab, (1, SEQ), generator=gen))


@pytest.mark.parametrize("flags", [[], ["--norm-before-residual"], ["--norm-output"]],
                         ids=["default", "norm_before_residual", "norm_output"])
def test_a_speculators_checkpoint_drafts_the_same_in_specdec(side_python, tmp_path, flags):
    model_dir, verifier_dir = tmp_path / "theirs", tmp_path / "verifier"
    side(side_python, "build", "--out", str(model_dir), "--verifier", str(verifier_dir), "--seed", "5",
         "--hidden", "64", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--vocab", "256",
         "--draft-vocab", "96", "--intermediate", "128", "--aux-layers", "1", "2", "3", *flags)
    target = load_model(str(verifier_dir), "target", torch.device("cpu"), torch.float32)
    drafter = load_eagle(str(model_dir), target)            # speculators' folder, detected and imported
    assert isinstance(drafter, Eagle3Drafter) and drafter.layout.reduced_vocab
    assert drafter.layout.own_embedding                     # their saved embedding is not the verifier's
    hidden, ids = random_inputs(64, 3, 256)
    assert_same_drafts(our_ttt_logits(drafter, hidden, ids, STEPS),
                       their_ttt_logits(side_python, model_dir, hidden, ids, tmp_path))


def test_our_export_drafts_the_same_in_speculators(side_python, tmp_path):
    target = tiny_model("llama", seed=2, layers=4, hidden=64, sharpen=3.0)
    target.save_pretrained(tmp_path / "target")               # its verifier.name_or_path must resolve
    char_tokenizer().save_pretrained(tmp_path / "target")
    vocab = target.config.vocab_size
    drafter = random_drafter(target, (1, 2, 3), seed=7, draft_vocab=list(range(3, vocab, 2)))
    with torch.no_grad():                                     # norms away from 1, as trained ones are
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    drafter.attach_embedding(target.get_input_embeddings())
    export_eagle3(drafter, str(tmp_path / "ours"), "speculators", target=target, verifier=str(tmp_path / "target"))
    hidden, ids = random_inputs(64, 3, vocab, seed=1)
    assert_same_drafts(our_ttt_logits(drafter, hidden, ids, STEPS),
                       their_ttt_logits(side_python, tmp_path / "ours", hidden, ids, tmp_path))


def test_a_trained_drafter_exports_to_speculators(side_python, tmp_path):
    """A trained drafter (the shipped EAGLE-3 recipe's, or any): set SPECDEC_SPECULATORS_DRAFTER to its
    folder and SPECDEC_SPECULATORS_TARGET to its target's. Its speculators export, loaded by
    speculators' own from_pretrained, drafts what ours drafts on the target's real features (of a
    random window of its tokens), at every step, EAGLE 3.1's norm_before_fc / norm_output included where it has them:
        SPECDEC_SPECULATORS_DRAFTER=runs/eagle3 SPECDEC_SPECULATORS_TARGET=MODELS/pycode/target \\
            bash scripts/interop/check_speculators.sh -k trained"""
    folder, target_dir = os.environ.get("SPECDEC_SPECULATORS_DRAFTER"), os.environ.get("SPECDEC_SPECULATORS_TARGET")
    if not folder or not target_dir:
        pytest.skip("set SPECDEC_SPECULATORS_DRAFTER and SPECDEC_SPECULATORS_TARGET to check a trained drafter")
    target = load_model(target_dir, "target", torch.device("cpu"), torch.float32)
    drafter = load_eagle(folder, target)
    assert isinstance(drafter, Eagle3Drafter), "an EAGLE-3 drafter (layout=eagle3) exports to speculators"
    export_eagle3(drafter, str(tmp_path / "ours"), "speculators", target=target, verifier=target_dir)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, 4 * SEQ), generator=gen)
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    hidden = torch.cat([states[i] for i in drafter.layout.feature_layers], dim=-1).float()
    assert_same_drafts(our_ttt_logits(drafter, hidden, ids, STEPS),
                       their_ttt_logits(side_python, tmp_path / "ours", hidden, ids, tmp_path))
