"""The trainers' DDP tests launch a trainer module under torchrun, gloo on the CPU, this one way."""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(module: str, args: list[str], processes: int, output_dir: str, port: int) -> None:
    """Run `python -m module *args output_dir=...` as `processes` torchrun processes (one torch thread each);
    `port`: a base master port of the test's own (the test process's id spreads it, so parallel sessions differ)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--master_port",
           str(port + processes + os.getpid() % 500), "-m", module, *args, f"output_dir={output_dir}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
