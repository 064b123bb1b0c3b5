#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment: bash scripts/bootstrap.sh [VENV_DIR]
# * a Python that already has torch (e.g. a CUDA build) lends it to the venv, untouched;
# * otherwise torch==2.13.0 is installed first (a CPU wheel where one lies on disk, as on
#   the project's machines), so the loose `torch` requirement never pulls a CUDA build.
set -euo pipefail
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP="$VENV/bin/python -m pip"
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "bootstrap: installing torch==2.13.0"
  $PIP install -q "torch==2.13.0"
fi
echo "bootstrap: installing specdec and its dependencies (with the test, benchmark and server extras)"
$PIP install -q -e ".[dev,bench,serve]"
touch "$VENV/.specdec-installed"
