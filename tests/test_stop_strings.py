"""Stop strings are matched on the decoded text, however many tokens they span: a non-ASCII stop
string that a byte-level tokenizer splits into one token per byte (more tokens than characters)
stops generation at exactly the token that completes it, and each token costs a decode of the few
tokens since the last released piece, not of the whole output."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch
import transformers as T

from conftest import hf_greedy, tiny_model
from specdec import Speculator
from specdec.stopping import MAX_PENDING_TOKENS, IncrementalText, StopRules
from specdec.strategies.autoregressive import Autoregressive
from specdec.strategies.draft_model import DraftModel

STOP = "ünïcödé→"
SCRIPT = "def f(x): return ünïcödé→ fox ünïcödé→ dog"
PROMPT_TOKENS = 5


@lru_cache(maxsize=None)
def ascii_byte_tokenizer():
    """A byte-level BPE (GPT-2 style) trained on ASCII text only: every byte outside ASCII stays
    a token of its own, so STOP (8 characters, 14 bytes) is 14 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog; return x"] * 4, trainer)
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


@lru_cache(maxsize=None)
def scripted_target():
    """A tiny Llama trained in-process to recite SCRIPT: its greedy continuation of the first
    PROMPT_TOKENS tokens is the rest of SCRIPT (checked where used)."""
    tok = ascii_byte_tokenizer()
    ids = torch.tensor([tok(SCRIPT)["input_ids"]])
    model = tiny_model("llama", seed=0, vocab=len(tok), hidden=64).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def stop_end(ids: list[int], tok) -> int:
    """Index of the token that completes the first STOP in the decoding of `ids`."""
    return next(k for k in range(len(ids)) if STOP in tok.decode(ids[: k + 1]))


def test_the_stop_string_spans_more_tokens_than_characters():
    tok = ascii_byte_tokenizer()
    assert len(tok(STOP)["input_ids"]) == len(STOP.encode()) == 14
    # the old rule decoded a window of len(STOP) + 2 tokens, too few to hold it
    assert len(tok(STOP)["input_ids"]) > len(STOP) + 2


def test_stop_rules_cut_at_the_token_that_completes_a_byte_level_stop_string():
    tok = ascii_byte_tokenizer()
    ids = tok("x = ünïcödé→ y ünïcödé→")["input_ids"]
    end = stop_end(ids, tok)
    assert StopRules(max_new_tokens=100, stop_strings=(STOP,), tokenizer=tok).cut([], ids) == (end + 1, "stop")
    # token by token, as runs of one: it fires on the same token and not before
    rules = StopRules(max_new_tokens=100, stop_strings=("nothing", STOP), tokenizer=tok)
    verdicts = [rules.cut(ids[:k], ids[k:k + 1]) for k in range(end + 1)]
    assert verdicts == [(1, None)] * end + [(1, "stop")]
    # runs that split the stop string between calls
    for size in (2, 3, 5, 7):
        rules = StopRules(max_new_tokens=100, stop_strings=(STOP,), tokenizer=tok)
        k = 0
        while True:
            keep, reason = rules.cut(ids[:k], ids[k:k + size])
            if reason is not None:
                break
            k += keep
        assert (k + keep, reason) == (end + 1, "stop"), size
    # a prefix of the stop string does not stop
    assert StopRules(max_new_tokens=100, stop_strings=(STOP,), tokenizer=tok).cut([], ids[:end]) == (end, None)


@pytest.mark.parametrize("kind", ["autoregressive", "draft_chain"])
def test_generation_stops_at_a_byte_level_stop_string(kind):
    tok, model = ascii_byte_tokenizer(), scripted_target()
    script = tok(SCRIPT)["input_ids"]
    prompt, rest = script[:PROMPT_TOKENS], script[PROMPT_TOKENS:]
    assert hf_greedy(model, prompt, len(rest), eos_token_id=None) == rest, "precondition: the target recites SCRIPT"
    expected = rest[: stop_end(rest, tok) + 1]
    strategy = Autoregressive() if kind == "autoregressive" else DraftModel(model, num_tokens=6)   # all accepted
    sd = Speculator(model, tok, strategy)
    out = sd.generate(prompt, max_new_tokens=len(rest), stop=STOP)
    assert out.token_ids == expected
    assert out.finish_reason == "stop"
    assert out.text.endswith(STOP) and out.text.count(STOP) == 1
    if kind == "draft_chain":      # the stop string completes inside a verify step's accepted run
        assert sum(a + 1 for a in out.stats.accepted_lengths) > out.stats.new_tokens
    stream = sd.stream(tok.decode(prompt), max_new_tokens=len(rest), stop=STOP)
    assert "".join(stream) == out.text and stream.finish_reason == "stop"


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every decode."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, []

    def decode(self, ids, **kwargs):
        self.decoded.append(len(ids))
        return self.tok.decode(ids, **kwargs)


def test_each_token_decodes_only_the_text_since_the_last_piece():
    tok = ascii_byte_tokenizer()
    ids = tok("ünïcödé→ the lazy dog " * 20)["input_ids"]
    counting = CountingTokenizer(tok)
    rules = StopRules(max_new_tokens=10_000, stop_strings=("never there",), tokenizer=counting)
    for k in range(len(ids)):
        assert rules.cut(ids[:k], ids[k:k + 1]) == (1, None)
    assert len(ids) > 200
    assert max(counting.decoded) <= 2 * MAX_PENDING_TOKENS       # not the whole output
    assert sum(counting.decoded) <= 8 * len(ids)


def test_invalid_bytes_are_released_and_a_stop_string_after_them_still_fires():
    tok = ascii_byte_tokenizer()
    lone = tok.convert_tokens_to_ids("Ģ")          # the byte-level symbol of byte 0x80: a lone continuation byte
    assert tok.decode([lone]) == "\ufffd"
    garbage, tail = [lone] * 50, tok(" ok " + STOP)["input_ids"]
    counting = CountingTokenizer(tok)
    rules = StopRules(max_new_tokens=10_000, stop_strings=(STOP,), tokenizer=counting)
    assert rules.cut([], garbage + tail) == (len(garbage + tail), "stop")
    assert max(counting.decoded) <= 2 * MAX_PENDING_TOKENS
    text = IncrementalText(tok)
    assert "".join(text.add(t) for t in garbage + tail) == tok.decode(garbage + tail)
