#!/usr/bin/env bash
# Build (or reuse) a side virtual environment holding speculators==0.9.0 on a CPU torch:
#   bash scripts/interop/speculators_env.sh [DIR]      (DIR defaults to .interop/speculators)
# The last line printed is the side env's python. Exits non-zero, with the reason on stderr,
# when the env cannot be built (tests skip with that reason).
#
# * torch==2.13.0 is installed first, from a CPU wheel where one lies in pip's find-links
#   (as on the project's machines), and a constraints file holds it there, so that
#   speculators' `torch<=2.14.1` never pulls a CUDA build;
# * speculators 0.9.0 depends on torchvision and torchaudio, whose builds pin one torch each and
#   break against a CPU torch they were not built with: both are uninstalled afterwards
#   (speculators' EAGLE-3 code does not import them).
set -euo pipefail
DIR="${1:-.interop/speculators}"
PYTHON="${PYTHON:-python3}"
SPECULATORS_VERSION="0.9.0"
TORCH_VERSION="2.13.0"
STAMP="$DIR/.speculators-$SPECULATORS_VERSION-ready"

fail() { echo "speculators_env: $*" >&2; exit 1; }

if [ -f "$STAMP" ] && [ -x "$DIR/bin/python" ]; then
  echo "$DIR/bin/python"
  exit 0
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "speculators $SPECULATORS_VERSION needs Python >= 3.11 ($PYTHON is $("$PYTHON" -V 2>&1))"
[ -x "$DIR/bin/python" ] || "$PYTHON" -m venv "$DIR" || fail "cannot create a venv in $DIR"
PIP=("$DIR/bin/python" -m pip)
LOG="$DIR/install.log"
: > "$LOG"

CONSTRAINTS="$DIR/constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

if ! "$DIR/bin/python" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$TORCH_VERSION'))" >/dev/null 2>&1; then
  # A CPU wheel in pip's find-links wins; otherwise ask for the +cpu build explicitly: a plain
  # torch==X from PyPI is a CUDA build of several GB.
  WHEEL=""
  for d in $("${PIP[@]}" config get global.find-links 2>/dev/null) ${PIP_FIND_LINKS:-}; do
    for w in "$d"/torch-"$TORCH_VERSION"+cpu-*.whl; do [ -f "$w" ] && WHEEL="$w"; done
  done
  if [ -n "$WHEEL" ]; then
    echo "speculators_env: installing torch from $WHEEL" >&2
    "${PIP[@]}" install -q "$WHEEL" >>"$LOG" 2>&1 || { tail -20 "$LOG" >&2; fail "cannot install $WHEEL"; }
  else
    echo "speculators_env: no local CPU wheel; asking for torch==$TORCH_VERSION+cpu" >&2
    "${PIP[@]}" install -q "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu >>"$LOG" 2>&1 \
      || { tail -20 "$LOG" >&2; fail "no CPU build of torch $TORCH_VERSION can be installed"; }
  fi
fi

echo "speculators_env: installing speculators==$SPECULATORS_VERSION" >&2
"${PIP[@]}" install -q -c "$CONSTRAINTS" "speculators==$SPECULATORS_VERSION" >>"$LOG" 2>&1 \
  || { tail -20 "$LOG" >&2; fail "pip cannot install speculators==$SPECULATORS_VERSION (log: $LOG)"; }
"${PIP[@]}" uninstall -q -y torchvision torchaudio >>"$LOG" 2>&1 || true

"$DIR/bin/python" - <<'EOF' >&2 || fail "speculators does not import in $DIR (log: $LOG)"
import importlib.metadata, torch, transformers, speculators  # noqa: F401
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: F401
print(f"speculators_env: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"speculators {importlib.metadata.version('speculators')}")
EOF
touch "$STAMP"
echo "$DIR/bin/python"
