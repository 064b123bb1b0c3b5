"""A stream closed before it finished reports finish_reason "cancelled"; a finished stream keeps
its own reason after close()."""
from __future__ import annotations

from functools import lru_cache

from conftest import char_tokenizer, tiny_model
from specdec import Speculator
from specdec.strategies.autoregressive import Autoregressive

PROMPT = "def f"


@lru_cache(maxsize=None)
def speculator() -> Speculator:
    return Speculator(tiny_model("llama", seed=0), char_tokenizer(), Autoregressive())


def test_closing_an_unfinished_stream_cancels_it():
    stream = speculator().stream(PROMPT, max_new_tokens=20, ignore_eos=True)
    next(stream)
    assert stream.finish_reason is None
    stream.close()
    assert stream.finish_reason == "cancelled"
    assert list(stream) == []
    stream.close()                                            # closing twice changes nothing
    assert stream.finish_reason == "cancelled"


def test_closing_before_the_first_piece_cancels_it():
    stream = speculator().stream(PROMPT, max_new_tokens=20, ignore_eos=True)
    stream.close()
    assert stream.finish_reason == "cancelled" and stream.token_ids == []


def test_leaving_a_with_block_early_cancels_it():
    with speculator().stream(PROMPT, max_new_tokens=20, ignore_eos=True) as stream:
        next(stream)
    assert stream.finish_reason == "cancelled"


def test_a_finished_stream_keeps_its_reason_after_close():
    stream = speculator().stream(PROMPT, max_new_tokens=5, ignore_eos=True)
    text = "".join(stream)
    assert stream.finish_reason == "length"
    stream.close()
    assert stream.finish_reason == "length"
    with speculator().stream(PROMPT, max_new_tokens=5, ignore_eos=True) as again:
        assert "".join(again) == text
    assert again.finish_reason == "length"
