#!/usr/bin/env bash
# scripts/gpu/auto_probe.py on the GPU machine, from gpu-pack/ (pack.sh --models MODELS/pycode, then an EAGLE
# drafter for the target copied to gpu-pack/models/eagle; the pack's draft weights may be left out):
#   OUT=$OUT bash scripts/gpu/auto_probe.sh     # writes $OUT/auto_probe.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/specdec-site gpu-pack/wheels/*.whl
export PYTHONPATH=/tmp/specdec-site HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
M=/tmp/auto-probe-models
mkdir -p "$M/target" "$M/draft"
cp gpu-pack/models/target/*.json "$M/target/"
cp gpu-pack/models/draft/tokenizer* "$M/draft/"
"$PY" scripts/gpu/planes.py unpack gpu-pack/models/target/model.planes "$M/target/model.safetensors"
"$PY" scripts/gpu/local_split.py gpu-pack/models/split.json "$M/split.json"
"$PY" -P scripts/gpu/auto_probe.py "$M" "$(pwd)/gpu-pack/models/eagle" cuda bfloat16 128 3 2 2>&1 \
  | grep -v "Loading weights" | tee "$OUT/auto_probe.txt"
