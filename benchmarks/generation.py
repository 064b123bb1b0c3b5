"""What every benchmark row shares, ours and Hugging Face's: the Generation a row returns, and the
generation_config every row runs with."""
from __future__ import annotations

import copy
from dataclasses import dataclass

from transformers import GenerationConfig

# generation_config settings no fixed-length row can share: they act on EOS, which every row
# ignores (HF's rows through peers.NO_EOS, ours through ignore_eos), or warp sampling beyond the
# temperature / top-k / top-p that all rows set alike.
NOT_SHARED = dict(min_length=0, min_new_tokens=None, exponential_decay_length_penalty=None,
                  min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None)


@dataclass
class Generation:
    token_ids: list[int]
    stats: dict | None = None          # specdec Stats.as_dict(); None for HF rows
    accepted_lengths: list[int] | None = None   # ours: drafted tokens accepted at each verify step


def shared_generation_config(target) -> GenerationConfig:
    """The checkpoint's generation_config as every benchmark row runs it, HF's and ours: its logits
    processing (repetition penalty, no-repeat n-grams, bad words, ...) kept, NOT_SHARED reset."""
    gc = copy.deepcopy(target.generation_config)
    gc.update(**NOT_SHARED)
    return gc
