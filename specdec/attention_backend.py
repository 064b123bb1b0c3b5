"""PyTorch's cuDNN attention backend, turned off for speculative decoding on a CUDA GPU.

`scaled_dot_product_attention` on a Hopper GPU may pick cuDNN's fused attention. cuDNN builds an
execution plan for every new set of shapes and keeps it for when the shapes come back. A decode loop
never brings them back: the key length grows every step, and a speculative step's query rows change
with its tree. So every attention call of every layer pays for a plan on the host, which leaves the
GPU idle and makes a small model's forward many times slower than flash or memory-efficient
attention (scripts/gpu/pace.py measures it; benchmarks/results/gpu/h200.md). Turning it off is
process-wide: PyTorch keeps the choice in one global flag, not per model or per thread."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def avoid_cudnn_attention(device: torch.device) -> bool:
    """Turn PyTorch's cuDNN SDPA backend off when `device` is a CUDA GPU and it is on. True when this
    call turned it off (said once in the log); flash, memory-efficient and math attention stay."""
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    log.info("turned PyTorch's cuDNN attention backend off for this process: it builds a plan per new key "
             "length, which is every decode step (set cudnn_attention: true to keep it)")
    return True
