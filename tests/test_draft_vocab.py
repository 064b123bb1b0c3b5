"""draft_vocab (strategies/draft_vocab.py): a drafter's vocabulary projection cut to a corpus's most frequent
tokens. The cut projection equals the whole one on the kept tokens and gives -inf elsewhere; the kept tokens are
the datastore's most frequent; bad settings are refused saying what to do; draft_model (its lean forward and its
own), medusa and EAGLE-1 with a cut vocabulary draft only kept tokens and stay identical to Hugging Face's greedy
text, and the output law through the rejection sampler stays the target's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import char_tokenizer, hf_greedy, noisy_copy, tiny_model
from eagle_helpers import random_drafter
from specdec import Speculator
from specdec.cache import new_cache
from specdec.config import SpecConfig
from specdec.errors import ConfigError
from specdec.heads.io import output_vocab
from specdec.sampling import SamplingParams
from specdec.strategies import draft_vocab
from specdec.strategies.datastore import DatastoreError, build, tokenizer_fingerprint
from specdec.strategies.draft_model import DraftModel
from specdec.strategies.draft_vocab import MIN_SIZE, VocabSubset, most_frequent, project, token_counts
from specdec.strategies.eagle import Eagle
from specdec.strategies.medusa import Medusa
from test_medusa import fresh_heads

PROMPTS = [[1, 5, 9, 14, 3, 7, 22, 40, 5, 9], [2, 8, 8, 30, 41, 6, 17, 9, 3, 12, 50, 4]]


def _kept(vocab: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].sort().values


# ---------------------------------------------------------------------- the cut projection
@pytest.mark.parametrize("bias", [False, True])
def test_cut_projection_is_the_whole_one_on_the_kept_tokens_and_minus_inf_elsewhere(bias):
    torch.manual_seed(0)
    linear = nn.Linear(16, 40, bias=bias)
    kept = _kept(40, 12)
    subset = VocabSubset(kept)
    x = torch.randn(3, 5, 16)
    cut = subset.linear(x, linear.weight, linear.bias)                                     # [3, 5, 40]
    whole = linear(x)
    off = torch.ones(40, dtype=torch.bool)
    off[kept] = False
    torch.testing.assert_close(cut[..., kept], whole[..., kept])
    assert torch.isneginf(cut[..., off]).all()
    torch.testing.assert_close(subset.mask(whole), cut)                # masking the whole projection: the same
    with torch.no_grad():                                              # a changed weight is read anew
        linear.weight.mul_(2)
    torch.testing.assert_close(subset.linear(x, linear.weight, linear.bias)[..., kept], linear(x)[..., kept])

    class Patched(nn.Linear):             # a module that is not a plain nn.Linear runs whole, then is masked
        pass

    patched = Patched(16, 40, bias=bias)
    torch.testing.assert_close(project(subset, patched, x), subset.mask(patched(x)))
    torch.testing.assert_close(project(None, linear, x), linear(x))


def test_the_kept_tokens_are_the_corpus_most_frequent(tmp_path):
    tokenizer = char_tokenizer()
    streams = [[5, 5, 5, 7, 7, 9], [7, 11, 5, 90]]                      # 5: 4 times, 7: 3, then 9, 11, 90 once
    build(streams, tmp_path / "store", tokenizer_fingerprint(tokenizer))
    from specdec.strategies.datastore import Datastore
    store = Datastore.open(tmp_path / "store", None)
    counts = token_counts(store, 96)
    assert counts.shape == (96,) and counts[5] == 4 and counts[7] == 3 and counts.sum() == 10   # no separators
    assert token_counts(store, 50).sum() == 9                         # ids past a narrower projection left out
    assert most_frequent(counts, 3).tolist() == [5, 7, 9]             # ties: the lower id first; ascending
    assert most_frequent(np.array([0, 2, 2, 1]), 2).tolist() == [1, 2]


def _cfg(size: int, corpus=None) -> SpecConfig:
    cfg = SpecConfig()
    cfg.draft_vocab.size, cfg.draft_vocab.corpus = size, None if corpus is None else str(corpus)
    return cfg


def test_bad_settings_are_refused_saying_what_to_do(tmp_path):
    tokenizer = char_tokenizer()
    build([list(range(3, 90))], tmp_path / "store", tokenizer_fingerprint(tokenizer))
    assert draft_vocab.from_config(SpecConfig(), tokenizer, 96, "the draft") is None        # size 0: every token
    assert draft_vocab.from_config(_cfg(96, tmp_path / "store"), tokenizer, 96, "the draft") is None   # all kept
    subset = draft_vocab.from_config(_cfg(40, tmp_path / "store"), tokenizer, 96, "the draft")
    assert len(subset) == 40 and subset.token_ids.tolist() == list(range(3, 43))
    with pytest.raises(ConfigError, match="needs draft_vocab.corpus.*specdec index"):
        draft_vocab.from_config(_cfg(40), tokenizer, 96, "the draft")
    with pytest.raises(ConfigError, match=f"below {MIN_SIZE}"):
        draft_vocab.from_config(_cfg(MIN_SIZE - 1, tmp_path / "store"), tokenizer, 96, "the draft")
    with pytest.raises(DatastoreError, match="another tokenizer"):
        draft_vocab.from_config(_cfg(40, tmp_path / "store"), char_tokenizer(reverse=True), 96, "the draft")
    with pytest.raises(DatastoreError, match="not a REST datastore"):
        draft_vocab.from_config(_cfg(40, tmp_path / "nothing"), tokenizer, 96, "the draft")


def test_a_rebuilt_datastore_is_read_anew(tmp_path):
    import os
    tokenizer = char_tokenizer()
    fingerprint = tokenizer_fingerprint(tokenizer)
    build([list(range(3, 43)) * 2], tmp_path / "store", fingerprint)
    assert draft_vocab.from_config(_cfg(40, tmp_path / "store"), tokenizer, 96, "the draft").token_ids.tolist() \
        == list(range(3, 43))
    build([list(range(50, 90)) * 2], tmp_path / "store", fingerprint)
    meta = tmp_path / "store" / "meta.json"
    os.utime(meta, ns=(meta.stat().st_atime_ns, meta.stat().st_mtime_ns + 10 ** 9))   # a coarse clock's rebuild
    assert draft_vocab.from_config(_cfg(40, tmp_path / "store"), tokenizer, 96, "the draft").token_ids.tolist() \
        == list(range(50, 90))


def test_an_eagle3_drafter_with_its_own_lm_head_is_refused(monkeypatch):
    import specdec.heads.eagle_io as eagle_io
    from specdec.strategies import eagle
    model = tiny_model("llama", seed=0, layers=3)
    monkeypatch.setattr(eagle_io, "load_eagle", lambda path, target: random_drafter(model, (1, 2, 2), seed=1))
    cfg = _cfg(40, "unused")
    cfg.eagle.path = "EAGLE3"
    with pytest.raises(ConfigError, match="own lm_head.*draft_vocab_size"):
        eagle.from_config(cfg, model, None, "cpu", torch.float32)


# ---------------------------------------------------------------------- the drafters with a cut vocabulary
def _proposed_tokens(monkeypatch, cls) -> list[int]:
    """Every token the strategies of class `cls` propose from now on (tree nodes; the pending token is not one)."""
    seen: list[int] = []
    propose = cls.propose

    def recording(self, state):
        tree = propose(self, state)
        seen.extend(tree.tokens.tolist())
        return tree

    monkeypatch.setattr(cls, "propose", recording)
    return seen


def _strategy(kind: str, target, kept: torch.Tensor):
    subset = VocabSubset(kept)
    if kind.startswith("draft_model"):
        return DraftModel(noisy_copy(target, noise=0.2), num_tokens=3, lean_forward=kind == "draft_model",
                          vocab_subset=subset)
    if kind.startswith("medusa"):
        heads = fresh_heads(target, noise=0.1, seed=1, own_lm_head="own" in kind,
                            token_conditioned="conditioned" in kind)
        heads.init_own_lm_heads(target.get_output_embeddings().weight)       # own projections: the target's
        heads.vocab_subset = subset
        return Medusa(heads, max_nodes=8, top_k=3)
    drafter = random_drafter(target, seed=1)
    drafter.vocab_subset = subset
    # no table chain: its nodes are the target's own top-1 tokens, read from a table, not drafted
    return Eagle(drafter, max_nodes=8, top_k=3, depth=3, table_chain=0)


@pytest.mark.parametrize("kind", ["draft_model", "draft_model HF forward", "medusa", "medusa conditioned",
                                  "medusa own lm_head", "eagle"])
def test_drafters_with_a_cut_vocabulary_draft_kept_tokens_and_stay_identical(monkeypatch, kind):
    target = tiny_model("llama", seed=0, sharpen=6.0)
    vocab = output_vocab(target)
    with torch.no_grad():          # the target's likely next tokens, so that drafts are kept as well as cut
        likely = target(torch.tensor([PROMPTS[0] + PROMPTS[1]])).logits[0].argmax(-1).unique()
    kept = torch.cat([likely, _kept(vocab, 48, seed=3)]).unique()
    strategy = _strategy(kind, target, kept)
    proposed = _proposed_tokens(monkeypatch, type(strategy))
    sd = Speculator(target, None, strategy)
    accepted = 0
    for prompt in PROMPTS:
        out = sd.generate(prompt, max_new_tokens=30, ignore_eos=True)
        assert out.token_ids == hf_greedy(target, prompt, 30, eos_token_id=None)
        accepted += sum(out.stats.accepted_lengths)
    assert proposed and set(proposed) <= set(kept.tolist())
    if kind != "eagle":              # an untrained EAGLE drafter guesses wrong anyway
        assert accepted > 0


def test_the_draft_models_lean_and_own_forward_cut_alike():
    """The lean forward's cut projection and the own forward's masked logits: the same kept logits, -inf elsewhere."""
    target = tiny_model("llama", seed=0)
    kept = _kept(output_vocab(target), 40)
    draft = noisy_copy(target, noise=0.2)
    ids = torch.tensor([PROMPTS[0]])
    logits = {}
    for lean in (True, False):
        strategy = DraftModel(draft, lean_forward=lean, vocab_subset=VocabSubset(kept))
        strategy.bind(target, None)
        strategy.cache = new_cache(draft)
        with torch.no_grad():
            logits[lean] = strategy._logits(ids)
    torch.testing.assert_close(logits[True], logits[False])
    off = torch.ones(logits[True].shape[-1], dtype=torch.bool)
    off[kept] = False
    assert torch.isneginf(logits[True][:, off]).all() and torch.isfinite(logits[True][:, kept]).all()


# ---------------------------------------------------------------------- the output law
@pytest.mark.parametrize("kind,case", [("draft_model", 0), ("draft_model", 1), ("medusa conditioned", 0)])
def test_exact_law_through_the_rejection_sampler_with_a_cut_vocabulary(kind, case):
    """The law of three tokens on a 5-token vocabulary, every draw enumerated: drafts come only from tokens 0, 2
    and 4 (the target often wants 1 or 3 too), and the output is the target's law, with drafts kept and
    rejected; a verifier that accepts every draft breaks it."""
    from self_draft import LAW_CASES, LAW_TARGET, check_always_accept_breaks_the_law, check_output_law
    kept = torch.tensor([0, 2, 4])
    check_output_law(_strategy(kind, LAW_TARGET, kept), LAW_CASES[case][1])
    check_always_accept_breaks_the_law(_strategy(kind, LAW_TARGET, kept))
