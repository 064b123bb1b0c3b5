"""A drafter's vocabulary projection cut to a corpus's most frequent tokens (FR-Spec, Zhao et al. 2025;
EAGLE-3's draft vocabulary, applied at load time to drafters trained on the whole vocabulary).

A drafter's last matrix product, hidden [n, H] x weight [V, H], reads the whole [V, H] weight on every
call: for a small drafter on a CPU that read is most of a call (Medusa's heads and EAGLE-1 project through
the target's lm_head once per tree depth; a small draft model's tied lm_head is half its weights). Keeping
only the `size` rows of the tokens most frequent in a corpus reads `size / V` of it. The logits come back
over the whole vocabulary with -inf off the kept tokens, so every caller (top-k, the coupled sampler's
scores, softmax into draft_probs) works as before: the drafter gives those tokens no mass, and since the
verifier keeps only what the target would have produced (greedy match, or rejection sampling against the
draft distribution that was actually sampled from), the output's law does not change, only how often a
draft is right.

The corpus is a REST datastore (`specdec index FILES... --out DIR --tokenizer TARGET`): it is checked whole
and refused when built with another tokenizer (strategies/datastore.py), and its token counts rank the
vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
import os
from typing import Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from specdec.config import setting
from specdec.errors import ConfigError

from .datastore import SEPARATOR, Datastore, tokenizer_fingerprint

# a tree's widest level takes at most this many children of one node (top-k): a smaller vocabulary would
# make the drafter propose tokens it gives no mass
MIN_SIZE = 32


@dataclass
class DraftVocabConfig:
    """The `draft_vocab:` section: cut the vocabulary projection of draft_model, medusa and eagle (EAGLE-1
    layout) to a corpus's most frequent tokens; what the drafters propose changes, the output's law does not."""
    size: int = setting(0, min=0)       # tokens kept (0 = the whole vocabulary); e.g. half of it: the projection
    #                                     reads half the weight, and drafts of the other tokens are never made
    corpus: Optional[str] = None        # a datastore folder (`specdec index FILES... --out DIR --tokenizer
    #                                     TARGET`) whose token counts rank the vocabulary; needed with a size


def token_counts(datastore: Datastore, vocab_size: int) -> np.ndarray:
    """[vocab_size] how often each token id below vocab_size occurs in the datastore's corpus (separators left
    out; a drafter whose projection is narrower than the tokenizer cannot propose the ids past it anyway)."""
    tokens = np.asarray(datastore.tokens)
    tokens = tokens[tokens != SEPARATOR]
    return np.bincount(tokens, minlength=vocab_size)[:vocab_size]


def most_frequent(counts: np.ndarray, size: int) -> torch.Tensor:
    """[size] the ids of the `size` largest counts (ties: the lower id first), ascending."""
    order = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(order).astype(np.int64))


@lru_cache(maxsize=8)
def _kept_ids(corpus: str, stamp: int, fingerprint: str | None, vocab_size: int, size: int) -> torch.Tensor:
    """Cached per datastore and its meta.json's modification time (`stamp`): a rebuilt datastore is read anew."""
    return most_frequent(token_counts(Datastore.open(corpus, fingerprint), vocab_size), size)


def _stamp(corpus: str) -> int:
    try:
        return os.stat(os.path.join(corpus, "meta.json")).st_mtime_ns
    except OSError:
        return -1                       # no datastore there: Datastore.open says so


class VocabSubset:
    """linear(x, weight, bias) -> [..., V] logits of the kept token ids, -inf elsewhere, reading only the kept
    rows of `weight` (a copy of them, made once per weight and refreshed when the weight changes)."""

    def __init__(self, token_ids: torch.Tensor):
        self.token_ids = token_ids                              # [S] ascending target ids
        self._rows: dict = {}                                   # weight key -> (kept rows [S, H], bias [S] | None,
        #                                                         ids on the weight's device)
        self._off: dict = {}                                    # (device, V) -> [V] bool, True off the kept ids

    def __len__(self) -> int:
        return len(self.token_ids)

    def _kept(self, weight: torch.Tensor, bias: torch.Tensor | None):
        key = (weight.data_ptr(), weight._version, weight.device, weight.dtype,
               None if bias is None else (bias.data_ptr(), bias._version))
        kept = self._rows.get(key)
        if kept is None:
            ids = self.token_ids.to(weight.device)
            kept = (weight.detach()[ids].contiguous(), None if bias is None else bias.detach()[ids].contiguous(), ids)
            if len(self._rows) >= 16:   # stale copies of moved or retrained weights (Medusa's own heads are K)
                self._rows.clear()
            self._rows[key] = kept
        return kept

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """[..., H] -> [..., V] with V = weight's rows."""
        rows, kept_bias, ids = self._kept(weight, bias)
        kept = F.linear(x, rows, kept_bias)                                        # [..., S]
        full = kept.new_full((*kept.shape[:-1], weight.shape[0]), float("-inf"))  # [..., V]
        return full.index_copy_(-1, ids, kept)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] full logits -> the same with -inf off the kept ids (a projection that could not be cut)."""
        key = (logits.device, logits.shape[-1])
        off = self._off.get(key)
        if off is None:
            off = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
            off[self.token_ids[self.token_ids < logits.shape[-1]].to(logits.device)] = False
            self._off[key] = off
        return logits.masked_fill(off, float("-inf"))


def project(subset: VocabSubset | None, projection: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """projection(x), a vocabulary projection [..., H] -> [..., V], through `subset`: only its kept rows where the
    projection is a plain nn.Linear; any other module (quantized, patched) runs whole and is masked."""
    if subset is None:
        return projection(x)
    if type(projection) is nn.Linear:
        return subset.linear(x, projection.weight, projection.bias)
    return subset.mask(projection(x))


def from_config(cfg, tokenizer, vocab_size: int, who: str) -> VocabSubset | None:
    """The subset `cfg.draft_vocab` asks of a drafter whose projection has `vocab_size` rows (None: the whole
    vocabulary). `who` names the drafter in errors."""
    section = getattr(cfg, "draft_vocab", None)
    if section is None or not section.size:
        return None
    size = int(section.size)
    if not section.corpus:
        raise ConfigError(f"draft_vocab.size={size} needs draft_vocab.corpus: a datastore of text like the one you "
                          f"generate, whose token counts choose the kept tokens (`specdec index FILES... --out DIR "
                          f"--tokenizer TARGET`, then draft_vocab.corpus=DIR)")
    if size >= vocab_size:
        return None                                             # everything kept: nothing to cut
    if size < MIN_SIZE:
        raise ConfigError(f"draft_vocab.size={size} is below {MIN_SIZE}: a tree's level may take more children of one "
                          f"node than that; keep at least {MIN_SIZE} tokens (or 0 for {who}'s whole vocabulary of "
                          f"{vocab_size})")
    fingerprint = None if tokenizer is None else tokenizer_fingerprint(tokenizer)
    corpus = str(section.corpus)
    return VocabSubset(_kept_ids(corpus, _stamp(corpus), fingerprint, int(vocab_size), size))
