"""The GPU check (scripts/gpu/check.sh) in its dry run: every step on this CPU with tiny random
models, so the prepared GPU run keeps working between the rare occasions a GPU is lent. The steps
are those of the real run; only the sizes and the device differ."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["setup", "environment", "cuda_syncs", "device_tests", "recurrent_tests", "train_eagle", "bf16_identity",
         "bench", "memory", "bench_batch", "bench_compile"]


def test_dry_run_passes_every_step(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "CHECK_BUDGET": "1500"}
    done = subprocess.run(["bash", "scripts/gpu/check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    summary = (tmp_path / "out" / "summary.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in summary.splitlines()[2:]}
    log = (tmp_path / "out" / "check.log").read_text()
    assert list(rows) == STEPS, summary
    assert all(status == "ok" for status in rows.values()), summary + log[-4000:]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as results:
        names = {Path(name).as_posix().lstrip("./") for name in results.getnames()}
    for wanted in ("environment.json", "bf16_identity.jsonl", "bench/results.md", "bench_batch/results.md",
                   "bench_compile/results.md", "memory.txt", "eagle/eagle.safetensors"):
        assert wanted in names, sorted(names)
    assert len(list((tmp_path / "out").iterdir())) <= 8      # what the GPU tool brings back


def test_planes_round_trip_is_exact(tmp_path):
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(0)
    weights = {"a": torch.randn(33, 7).to(torch.bfloat16), "b": torch.randn(5).to(torch.float16)}
    save_file(weights, tmp_path / "w.safetensors")
    script = ROOT / "scripts" / "gpu" / "planes.py"
    subprocess.run([sys.executable, script, "pack", tmp_path / "w.safetensors", tmp_path / "w.planes"], check=True)
    subprocess.run([sys.executable, script, "unpack", tmp_path / "w.planes", tmp_path / "back.safetensors"], check=True)
    assert (tmp_path / "back.safetensors").read_bytes() == (tmp_path / "w.safetensors").read_bytes()
    corrupt = bytearray((tmp_path / "w.planes").read_bytes())
    corrupt[-3] ^= 0xFF
    (tmp_path / "bad.planes").write_bytes(bytes(corrupt))
    bad = subprocess.run([sys.executable, script, "unpack", tmp_path / "bad.planes", tmp_path / "x.safetensors"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and not (tmp_path / "x.safetensors").exists()
