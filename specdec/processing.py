"""The checkpoint's own logits processing (its `generation_config`: repetition penalty, no-repeat
n-grams, bad words, suppressed tokens, minimum length, ...), applied to every row the target scores
and to every distribution a draft proposes from, exactly as `model.generate()` applies it.

The processors are Hugging Face's own, built by `model._get_logits_processor` from a copy of the
model's generation_config. A processor reads the ids before the position it scores, so in a tree
each row gets the committed ids plus that row's own path. The target's law is then the processed
one, and acceptance keeps it exactly. Sampling warps (temperature, top-k, top-p) stay specdec's
own (`sampling.warp_logits`), applied after processing as in `generate()`.

When the generation_config asks for nothing, the processor list is empty and `tree_rows` /
`rows` return the logits untouched: no per-row work.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

from .errors import InputError
from .tables import ShapeTables
from .tree import CandidateTree, depths_of, tree_shape, with_pending_root, host_to_device

# Processors that are pure functions of (ids so far, scores): safe to apply row by row to a tree.
SUPPORTED = (
    lp.RepetitionPenaltyLogitsProcessor, lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
    lp.SequenceBiasLogitsProcessor, lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor,
    lp.SuppressTokensLogitsProcessor, lp.SuppressTokensAtBeginLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor, lp.ForcedEOSTokenLogitsProcessor, lp.ExponentialDecayLengthPenalty,
    lp.InfNanRemoveLogitsProcessor, lp.LogitNormalization,
)


def generation_processors(model, prompt_ids: Sequence[int], max_new_tokens: int) -> LogitsProcessorList:
    """Hugging Face's logits processors for one greedy `generate()` call of `model` on prompt_ids
    (the warps of sampling excluded: specdec applies its own). Refuses, with a clear error, a
    processor that is not a pure function of the ids and scores."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return LogitsProcessorList()
    config = copy.deepcopy(config)
    prompt_len = len(prompt_ids)
    config.do_sample = False            # temperature / top-k / top-p are specdec's SamplingParams
    config.max_new_tokens = max_new_tokens
    config.max_length = prompt_len + max_new_tokens
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_len
    device = model.device
    model._prepare_special_tokens(config, True, device=device)
    prompt = host_to_device([list(prompt_ids)], device)
    processors = model._get_logits_processor(generation_config=config, input_ids_seq_length=prompt_len,
                                              encoder_input_ids=prompt, logits_processor=LogitsProcessorList(),
                                              device=device, model_kwargs={})
    for processor in processors:
        if not isinstance(processor, SUPPORTED):
            raise InputError(
                f"the target's generation_config asks for {type(processor).__name__}, which specdec cannot "
                f"apply to a tree of candidates (it supports {', '.join(p.__name__ for p in SUPPORTED)}): "
                f"unset that setting in model.generation_config, or use plain model.generate()")
    return processors


class LogitsProcessing:
    """One generation's logits processing. `tree_rows` for the verifier's [pending] + tree rows,
    `rows` for rows that share one context length (a draft's chain step or tree level)."""

    def __init__(self, processors: LogitsProcessorList | None = None):
        self.processors = processors or LogitsProcessorList()

    @classmethod
    def for_generation(cls, model, prompt_ids: Sequence[int], max_new_tokens: int) -> "LogitsProcessing":
        return cls(generation_processors(model, prompt_ids, max_new_tokens))

    def __bool__(self) -> bool:
        return len(self.processors) > 0

    def rows(self, logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """[R, V] logits -> [R, V] processed fp32 logits; context [R, L] = the ids before each row's
        next token (all rows the same length)."""
        if not self.processors:
            return logits
        scores = logits.float().clone()             # processors may write in place
        return self.processors(context.to(scores.device), scores)

    def tree_rows(self, logits: torch.Tensor, committed: Sequence[int], tree: CandidateTree,
                  tables: ShapeTables | None = None) -> torch.Tensor:
        """[1 + N, V] verifier logits -> processed fp32 logits. Row 0 (the pending token's) continues
        `committed`; row i + 1 continues committed + the path to node i. Rows of one depth share a
        length and are processed in one call. `tables`: where the tree shape's depths are kept."""
        if not self.processors:
            return logits
        device = logits.device
        prefix = host_to_device(list(committed), device)              # [C]
        out = logits.float().clone()
        out[:1] = self.processors(prefix[None], out[:1])
        if tree.num_nodes == 0:
            return out
        depths = depths_of(tree.parents)
        tokens = tree.tokens.to(device)
        paths = torch.empty(tree.num_nodes, max(depths) + 1, dtype=torch.long, device=device)   # [N, D]
        for node, parent in enumerate(tree.parents):     # parents come first: copy theirs, add own
            if parent >= 0:
                paths[node, : depths[node]] = paths[parent, : depths[node]]
            paths[node, depths[node]] = tokens[node]
        # nodes by depth from the depths of [pending] + tree, the verifier's shape kept in `tables` (rows 1..N: the
        # nodes, one deeper; a stable sort on the device, the counts per depth the host's): no nonzero(),
        # which would read the device back once per depth
        row_depths = tree_shape(with_pending_root(tree.parents), device, tables).depths                       # [1 + N]
        by_depth = torch.sort(row_depths[1:], stable=True).indices                                             # [N]
        start = 0
        for depth in range(max(depths) + 1):
            count = depths.count(depth)
            nodes = by_depth[start: start + count]                                               # [R]
            start += count
            context = torch.cat([prefix.expand(len(nodes), -1), paths[nodes, : depth + 1]], dim=1)
            out[nodes + 1] = self.processors(context, out[nodes + 1])
        return out
