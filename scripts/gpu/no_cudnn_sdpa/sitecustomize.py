# Put this folder on PYTHONPATH to run a process with PyTorch's cuDNN attention backend off: on the
# GPU image (torch 2.11, CUDA 13) it builds a plan for every new key length, about 6 ms of host time
# per attention call in a decode loop (scripts/gpu/pace.py).
import torch

torch.backends.cuda.enable_cudnn_sdp(False)
