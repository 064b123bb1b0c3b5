"""A long text's token ids, tokenized in overlapping windows: what `specdec index` reads a file with.

A fast tokenizer holds several hundred bytes per character of the text it tokenizes at once (its
normalized string keeps an alignment per byte, its pre-tokens their own copies): a 740 KB source file
took 115 MB. Windows of WINDOW characters bound that. Where two windows meet, each tokenizes their
OVERLAP characters, and the ids are stitched at a token that both tokenize alike, with the same tokens
on either side, at least MARGIN characters inside each window: there, neither window's edge (a
sentencepiece prefix at its start, a whitespace run cut at its end) reaches. Where no such token is
found (a single token spanning the overlap, a tokenizer without offsets), the whole text is tokenized at
once, as before. tests/test_windowed_tokens.py checks the ids against the whole text's.
"""
from __future__ import annotations

WINDOW = 1 << 16          # characters tokenized at once
OVERLAP = 2048            # characters two neighbouring windows both tokenize
MARGIN = 512              # a stitch lies at least this far inside both windows
AGREE = 4                 # tokens that must be the same in both windows at a stitch, from it on (and the one before)


def token_ids(tokenizer, text: str, window: int = WINDOW, overlap: int = OVERLAP, margin: int = MARGIN) -> list[int]:
    """The ids `tokenizer(text, add_special_tokens=False)` gives, tokenizing at most `window` characters at once."""
    if not 0 <= 2 * margin < overlap < window // 2:
        raise ValueError(f"token_ids needs 0 <= 2 * margin < overlap < window / 2 (a stitch inside each overlap, the "
                         f"overlaps apart), got window {window}, overlap {overlap}, margin {margin}")
    if len(text) <= window or not getattr(tokenizer, "is_fast", False):
        return whole(tokenizer, text)
    ids: list[int] = []
    begin = 0                                            # where the current window's text starts
    current = _encode(tokenizer, text, 0, window)        # (ids, starts, ends) of the current window
    first = 0                                            # its first token not yet taken
    while begin + window < len(text):
        following_begin = begin + window - overlap
        following = _encode(tokenizer, text, following_begin, following_begin + window)
        stitch = _stitch(current, following, following_begin + margin, begin + window - margin)
        if stitch is None:
            return whole(tokenizer, text)
        here, there = stitch
        ids.extend(current[0][first: here])
        begin, current, first = following_begin, following, there
    ids.extend(current[0][first:])
    return ids


def whole(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _encode(tokenizer, text: str, begin: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """(ids, start and end characters in `text`) of the tokens of text[begin:end]."""
    encoded = tokenizer(text[begin:end], add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    return encoded["input_ids"], [begin + a for a, _ in offsets], [begin + b for _, b in offsets]


def _stitch(current, following, low: int, high: int) -> tuple[int, int] | None:
    """(i, j): token i of `current` and token j of `following` start the same token at the same character in
    [low, high], and from the token before to AGREE tokens on, both windows tokenize alike; None if none does."""
    ids, starts, ends = current
    by_start = {}
    for j, start in enumerate(following[1]):
        if low <= start <= high:
            by_start.setdefault(start, j)        # the first token starting there (bytes of one character share it)
    for i, start in enumerate(starts):
        if not low <= start <= high or i == 0 or start not in by_start or ends[i - 1] > start:
            continue
        j = by_start[start]
        if j == 0 or i + AGREE > len(ids) or j + AGREE > len(following[0]):
            continue
        if all(current[k][i - 1: i + AGREE] == following[k][j - 1: j + AGREE] for k in range(3)):
            return i, j
    return None
