"""The speculators side environment for the conformance tests (scripts/interop/): built once per
session; tests that need it skip, with the build's own message, where it cannot be built."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "interop"


@pytest.fixture(scope="session")
def side_python() -> str:
    env_dir = os.environ.get("SPECDEC_SPECULATORS_ENV", str(ROOT / ".interop" / "speculators"))
    proc = subprocess.run(["bash", str(SCRIPTS / "speculators_env.sh"), env_dir],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.skip(f"speculators side env not available: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def side(python: str, *args: str) -> dict:
    """Run scripts/interop/speculators_side.py in the side env; its last stdout line (JSON)."""
    proc = subprocess.run([python, str(SCRIPTS / "speculators_side.py"), *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
