"""specdec: lossless speculative decoding for Hugging Face causal LMs.

    import specdec
    sd = specdec.load("draft_model", **{"target.path": "...", "draft.path": "..."})
    out = sd.generate("def parse(", max_new_tokens=128)
    out.text, out.token_ids, out.stats.tokens_per_forward
"""
from .api import Speculator, Stream
from .errors import (ConfigError, IncompatibleModelsError, InputError, ModelLoadError, SpecDecError,
                     StreamSupersededError)
from .loading import load
from .sampling import SamplingParams
from .tree import CandidateTree
from .types import GenerationOutput, Stats

__version__ = "0.1.0"

__all__ = ["load", "Speculator", "Stream", "CandidateTree", "SamplingParams", "GenerationOutput", "Stats",
           "SpecDecError", "ConfigError", "InputError", "ModelLoadError", "IncompatibleModelsError",
           "StreamSupersededError"]
