"""strategies/windowed_tokens.py: a long text tokenized in overlapping windows gives exactly the ids of the
whole text, through byte-level BPE (GPT-2's pre-tokenizer), a sentencepiece-like BPE (a prefix at each
window's start), a Llama-like BPE (no pre-tokenizer: the window is one word), a word-level and a character-level tokenizer, on source code and on text with multi-byte
characters and long whitespace runs; where no stitch can be found the whole text is tokenized at once."""
from __future__ import annotations

import inspect
import json
import random

import pytest

from conftest import char_tokenizer
from specdec.strategies import windowed_tokens
from specdec.strategies.windowed_tokens import token_ids

SMALL = dict(window=700, overlap=240, margin=50)      # many windows on a few kilobytes of text


def _source() -> str:
    return inspect.getsource(json.decoder) + inspect.getsource(random)


def _odd_text(seed: int = 0) -> str:
    rng = random.Random(seed)
    pieces = ["déjà vu", "naïve café", "日本語のテキスト", "emoji 🙂🚀", "\t\t", "\n\n\n", " " * 9, "x = 1", "'''", "\r\n"]
    return "".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "    "]) for _ in range(2000))


def _fast(tokenizer_object):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, unk_token="<unk>")


def _byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator([_source(), _odd_text(1)], trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _fast(raw)


def _sentencepiece_like_bpe():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    raw = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=False))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    raw.train_from_iterator([_source(), _odd_text(1)], trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"]))
    return _fast(raw)


def _llama_like_bpe():
    """Llama 2's layout: no pre-tokenizer (the whole text is one word to BPE), a normalizer that prepends "▁" and
    writes spaces as "▁", byte fallback."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    raw = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.train_from_iterator([_source()[:20000]], trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]))
    return _fast(raw)


def _word_level():
    from test_rest import word_tokenizer
    return word_tokenizer(sorted(set(_source().split()))[:300])


TOKENIZERS = {"byte-level BPE": _byte_level_bpe, "sentencepiece-like BPE": _sentencepiece_like_bpe,
              "Llama-like BPE": _llama_like_bpe,
              "word-level": _word_level, "char-level": char_tokenizer}


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("text", ["source", "odd"])
def test_windows_give_the_whole_texts_ids(name, text):
    tokenizer = TOKENIZERS[name]()
    body = _source() if text == "source" else _odd_text()
    expected = tokenizer(body, add_special_tokens=False)["input_ids"]
    assert len(body) > 10 * SMALL["window"]
    assert token_ids(tokenizer, body, **SMALL) == expected
    assert token_ids(tokenizer, body[:500], **SMALL) == tokenizer(body[:500], add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", ["byte-level BPE", "Llama-like BPE"])
def test_windows_are_stitched_not_tokenized_whole(monkeypatch, name):
    tokenizer = TOKENIZERS[name]()
    monkeypatch.setattr(windowed_tokens, "whole", lambda *args: pytest.fail("tokenized whole"))
    calls = []
    encode = windowed_tokens._encode
    monkeypatch.setattr(windowed_tokens, "_encode", lambda tok, text, begin, end: calls.append(end - begin) or encode(
        tok, text, begin, end))
    token_ids(tokenizer, _source(), **SMALL)
    assert len(calls) > 10 and max(calls) <= SMALL["window"]


def test_a_token_spanning_the_overlap_falls_back_to_the_whole_text(monkeypatch):
    tokenizer = _word_level()                # one unknown word of 3000 letters: one token, no stitch anywhere
    body = "def " + "q" * 3000 + " return"
    wholes = []
    monkeypatch.setattr(windowed_tokens, "whole", lambda tok, text: wholes.append(1) or tok(
        text, add_special_tokens=False)["input_ids"])
    assert token_ids(tokenizer, body, **SMALL) == tokenizer(body, add_special_tokens=False)["input_ids"]
    assert wholes == [1]


def test_bad_window_settings_are_refused():
    with pytest.raises(ValueError, match="margin < overlap < window / 2"):
        token_ids(char_tokenizer(), "abc", window=100, overlap=60, margin=10)
