"""Stop rules, checked token by token inside an accepted run, exactly as plain generation does:
the token that triggers a stop (EOS, a stop token, the end of a stop string) is kept, nothing after it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

# A byte-level token carries at least one byte and a character at most four, so a held-back run
# this long that still decodes to an unfinished character (or to no text) is invalid bytes, not a
# character under way: it is released as it decodes (replacement characters), which keeps the cost
# of each token bounded.
MAX_PENDING_TOKENS = 8


class IncrementalText:
    """The decoded text of a growing token sequence, one token at a time, each at the cost of
    decoding the few tokens since the last released piece (not the whole sequence).

    Decoding a token alone can differ from its part of a longer decode (a byte-level token may
    hold half a character; some tokenizers drop a leading space at the start of a decode), so each
    token is decoded behind the tokens of the piece before it, and its text is released once it no
    longer ends in an unfinished character (the scheme of Hugging Face's TextStreamer and vLLM's
    incremental detokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._context = 0       # token_ids[_context:_pending] decoded the previous released piece
        self._pending = 0       # token_ids[_pending:] are not released yet

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def add(self, token: int) -> str:
        """Append `token`; the new text it completes ("" while a character is still unfinished)."""
        self.token_ids.append(int(token))
        before = self._decode(self.token_ids[self._context:self._pending])
        text = self._decode(self.token_ids[self._context:])
        held = len(self.token_ids) - self._pending          # tokens not released, this one included
        if held < MAX_PENDING_TOKENS and (text.endswith("\ufffd") or len(text) <= len(before)):
            return ""
        self._context, self._pending = self._pending, len(self.token_ids)
        return text[len(before):]


@dataclass
class StopRules:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    tokenizer: object = None
    # the generated text as far as a stop string may still start in it: the last
    # (longest stop string - 1) characters, and the decoder of the generated tokens
    _tail: str = field(default="", init=False, repr=False)
    _text: IncrementalText | None = field(default=None, init=False, repr=False)

    def cut(self, generated: Sequence[int], run: Sequence[int]) -> tuple[int, str | None]:
        """How many tokens of `run` (new tokens after `generated`) to keep, and why generation
        stops there (None: it goes on)."""
        if self.stop_strings:
            self._catch_up(generated)
        for i, token in enumerate(run):
            count = len(generated) + i + 1
            if token in self.eos_token_ids:
                return i + 1, "eos"
            if token in self.stop_token_ids:
                return i + 1, "stop"
            if self.stop_strings and self._completes_stop_string(token):
                return i + 1, "stop"
            if count >= self.max_new_tokens:
                return i + 1, "length"
        return len(run), None

    def _catch_up(self, generated: Sequence[int]) -> None:
        """Bring the decoded text to `generated`. In the loop it already is (each call extends
        the tokens kept by the last one: nothing to do); another history is decoded afresh."""
        if self._text is not None and len(self._text.token_ids) == len(generated) and \
                (not generated or self._text.token_ids[-1] == generated[-1]):
            return
        self._text, self._tail = IncrementalText(self.tokenizer), ""
        for token in generated:
            self._tail = self._keep(self._tail + self._text.add(token))

    def _keep(self, text: str) -> str:
        """The end of `text` a stop string completed later may still start in."""
        longest = max(len(s) for s in self.stop_strings)
        return text[max(0, len(text) - longest + 1):]

    def _completes_stop_string(self, token: int) -> bool:
        """Add `token` to the text; True when the text it completes finishes an occurrence of a stop
        string (which may span many tokens, or end inside this one's text)."""
        piece = self._text.add(token)
        if not piece:
            return False
        window = self._tail + piece
        self._tail = self._keep(window)
        # only occurrences that end in the new piece: the earlier ones were checked before
        return any(window.find(s, max(0, len(window) - len(piece) - len(s) + 1)) >= 0 for s in self.stop_strings)
