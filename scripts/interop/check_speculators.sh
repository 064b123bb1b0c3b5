#!/usr/bin/env bash
# Conformance of specdec's EAGLE-3 drafters with speculators 0.9.0 (vLLM's format), against its own code:
#   bash scripts/interop/check_speculators.sh
# 1. builds (once) the side environment with speculators (scripts/interop/speculators_env.sh);
# 2. runs the slow conformance tests: our speculators export loaded by speculators' from_pretrained
#    drafts what ours drafts at every position of every step, and a checkpoint speculators builds and
#    saves with its own API loads into specdec's eagle and drafts what speculators' forward predicts
#    (tests/test_speculators_conformance.py), plus the side script's own checks (tests/test_speculators_side.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
ENV_DIR="${SPECDEC_SPECULATORS_ENV:-.interop/speculators}"
bash scripts/interop/speculators_env.sh "$ENV_DIR" >/dev/null
SPECDEC_SPECULATORS_ENV="$ENV_DIR" .venv/bin/python -m pytest -q -m slow \
    tests/test_speculators_conformance.py tests/test_speculators_side.py "$@"
