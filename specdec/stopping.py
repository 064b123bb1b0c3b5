"""Stop rules, checked token by token inside an accepted run, exactly as plain generation does:
the token that triggers a stop (EOS, a stop token, the end of a stop string) is kept, nothing after it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class StopRules:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    tokenizer: object = None
    _text_tail: str = field(default="", repr=False)

    def cut(self, generated: Sequence[int], run: Sequence[int]) -> tuple[int, str | None]:
        """How many tokens of `run` (new tokens after `generated`) to keep, and why generation
        stops there (None: it goes on)."""
        for i, token in enumerate(run):
            count = len(generated) + i + 1
            if token in self.eos_token_ids:
                return i + 1, "eos"
            if token in self.stop_token_ids:
                return i + 1, "stop"
            if self.stop_strings and self._ends_with_stop_string(list(generated) + list(run[: i + 1])):
                return i + 1, "stop"
            if count >= self.max_new_tokens:
                return i + 1, "length"
        return len(run), None

    def _ends_with_stop_string(self, generated: list[int]) -> bool:
        """True when the newest token completes an occurrence of a stop string (which may span
        several tokens, or end inside the newest token). Only a window of recent tokens long
        enough to hold the longest stop string is decoded."""
        longest = max(len(s) for s in self.stop_strings)
        window = generated[-(longest + 2):]
        text = self.tokenizer.decode(window, skip_special_tokens=False)
        before = self.tokenizer.decode(window[:-1], skip_special_tokens=False)
        return any(text.count(s) > before.count(s) for s in self.stop_strings)
