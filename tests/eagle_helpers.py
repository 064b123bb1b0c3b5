"""Shared builders for the eagle tests: drafters with known behaviour on tiny targets."""
from __future__ import annotations

import torch

from conftest import tiny_model
from specdec.heads.eagle import EagleDrafter, layout_for_target
from specdec.heads.eagle3 import Eagle3Drafter, eagle3_layout_for_target
from specdec.types import DecodeState
from specdec.sampling import SamplingParams, TorchRandom


def random_drafter(model, layers=(-1,), seed: int = 0, draft_vocab=None) -> EagleDrafter | Eagle3Drafter:
    """An untrained drafter (PyTorch's default random init): its guesses are mostly wrong. One layer:
    EAGLE-1; several: the standard EAGLE-3 drafter, over the target ids `draft_vocab` (None: all)."""
    torch.manual_seed(seed)
    if len(layers) == 1:
        return EagleDrafter(layout_for_target(model, layers))
    drafter = Eagle3Drafter(eagle3_layout_for_target(model, layers, len(draft_vocab) if draft_vocab else None))
    if draft_vocab:
        drafter.set_draft_vocab(torch.tensor(draft_vocab))
    return drafter


def leaning_eagle3(model, layers, token: int = 7, seed: int = 0) -> Eagle3Drafter:
    """A random EAGLE-3 drafter whose lm_head is zero but for `token`'s row: it guesses `token` where
    that row's logit is positive (its random layer decides where), else token 0."""
    drafter = random_drafter(model, layers, seed)
    with torch.no_grad():
        row = drafter.lm_head.weight[token].clone()
        drafter.lm_head.weight.zero_()
        drafter.lm_head.weight[token] = row * 10
    return drafter


def echo_drafter(model) -> EagleDrafter:
    """A drafter whose output is (the RMS-normalised) feature it reads: at the first level it
    guesses what the target said one position earlier; deeper it drifts (its own outputs)."""
    drafter = EagleDrafter(layout_for_target(model))
    size = drafter.layout.hidden_size
    with torch.no_grad():
        for p in drafter.parameters():
            p.zero_()
        drafter.fc.weight[:, :size] = torch.eye(size)
        for norm in (drafter.norm, drafter.block.attn_norm, drafter.block.mlp_norm):
            norm.weight.fill_(1.0)
    return drafter


def with_biased_head(model, token: int, bias: float, keep_weights: bool = True):
    """Replace the lm_head with a Linear that has a bias toward `token` (zero weights when
    keep_weights is False: the target then always says `token`)."""
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.weight.shape[1], old.weight.shape[0], bias=True)
    with torch.no_grad():
        if keep_weights:
            head.weight.copy_(old.weight)
        else:
            head.weight.zero_()
        head.bias.zero_()
        head.bias[token] = bias
    model.set_output_embeddings(head)
    return model


def biased_target(arch: str, bias: float, keep_weights: bool = True):
    return with_biased_head(tiny_model(arch, seed=1, sharpen=4.0), 7, bias, keep_weights)


def state_for(prompt: list[int], prompt_hidden, temperature: float = 0.0, max_depth: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return DecodeState(token_ids=list(prompt), prompt_len=len(prompt), sampling=SamplingParams(temperature),
                       rng=TorchRandom(generator), max_depth=max_depth, prompt_hidden=prompt_hidden)
