"""Step 1 of the GPU check: what machine and software the figures come from, as JSON on stdout
(GPU name, driver, CUDA, memory free, torch, transformers, specdec, Python)."""
from __future__ import annotations

import json
import platform
import subprocess
import sys


def nvidia_smi() -> dict:
    query = "name,driver_version,memory.total,memory.free,clocks.max.sm"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return {"nvidia_smi": f"unavailable ({type(exc).__name__})"}
    return dict(zip(query.split(","), (part.strip() for part in line.split(","))))


def main() -> int:
    import torch
    import transformers
    import specdec
    report = {"python": sys.version.split()[0], "platform": platform.platform(), "processor": platform.processor(),
              "torch": torch.__version__, "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
              "specdec": specdec.__version__, "specdec_file": specdec.__file__,
              "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        report.update(gpu=props.name, capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                      gpu_memory_free_gib=round(free / 2**30, 1), gpu_memory_total_gib=round(total / 2**30, 1),
                      bf16_supported=torch.cuda.is_bf16_supported(), **nvidia_smi())
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
