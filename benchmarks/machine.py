"""What the numbers were measured on."""
from __future__ import annotations

import os
import platform

import torch
import transformers


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device, dtype: torch.dtype) -> dict:
    info = {
        "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": str(device), "dtype": str(dtype).replace("torch.", ""),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cudnn_attention"] = torch.backends.cuda.cudnn_sdp_enabled()   # for every row, Hugging Face's too
    return info


def machine_line(info: dict) -> str:
    where = info.get("gpu") or f"{info['cpu']} ({info['cpu_count']} cores, {info['torch_threads']} torch threads)"
    return (f"{where}; {info['device']} {info['dtype']}; torch {info['torch']}, "
            f"transformers {info['transformers']}, Python {info['python']}")
