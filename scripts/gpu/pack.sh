#!/usr/bin/env bash
# Build what travels to the GPU machine (scripts/gpu/check.sh) into one ignored folder, gpu-pack/:
#   wheels/   specdec itself and omegaconf (the GPU image has torch, transformers, safetensors,
#             tokenizers, PyYAML, tqdm, rich, pytest and matplotlib, but no omegaconf), both pure
#             Python, installed there with --no-deps onto its own torch;
#   models/   the pycode family's target (its float16 weights, run in bfloat16 there), draft and
#             split, when --models names them; the weights packed by byte planes (planes.py:
#             lossless, 58.7 MB in about 50), unpacked by check.sh.
# Then it prints the size of what would travel (the repository's tracked files plus gpu-pack/)
# against the 64 MiB the GPU machine takes, and fails when it does not fit.
#
#   bash scripts/gpu/pack.sh [--models DIR] [--eagle DIR]
#     --models: a model family folder (target/, draft/, split.json)
#     --eagle:  an EAGLE drafter for that target (eagle.json + eagle.safetensors), packed in bfloat16,
#               for `check.sh --steps ...` without the training step
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=""
EAGLE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS="$2"; shift 2 ;;
    --eagle) EAGLE="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "pack.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
PACK=gpu-pack
LIMIT=$((64 * 1024 * 1024))
rm -rf "$PACK"
mkdir -p "$PACK/wheels"
"$PY" -m pip wheel -q --no-deps -w "$PACK/wheels" . >/dev/null
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$PACK/wheels" "omegaconf==2.4.0" 2>/dev/null \
  || { echo "pack.sh: could not fetch the omegaconf wheel (needs a package registry)" >&2; exit 1; }
if [ -n "$MODELS" ]; then
  for part in target draft; do
    if [ -d "$MODELS/$part" ]; then
      mkdir -p "$PACK/models/$part"
      cp "$MODELS/$part"/*.json "$PACK/models/$part/"
      "$PY" scripts/gpu/planes.py pack "$MODELS/$part/model.safetensors" "$PACK/models/$part/model.planes"
    fi
  done
  [ -f "$MODELS/split.json" ] && cp "$MODELS/split.json" "$PACK/models/"
fi
if [ -n "$EAGLE" ]; then
  mkdir -p "$PACK/models/eagle"
  cp "$EAGLE/eagle.json" "$PACK/models/eagle/"
  "$PY" - "$EAGLE/eagle.safetensors" "$PACK/models/eagle/eagle.safetensors" <<'EOF'
import sys
import torch
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}, sys.argv[2])
EOF
fi
# each file counted in whole 4 KiB blocks: the GPU tool refused a tree whose bytes summed 63.5 MiB as over its
# 64 (benchmarks/results/gpu/h200_lease4.md); counted by blocks it came to 65.8
blocks() { awk '{s += int(($1 + 4095) / 4096) * 4096} END {print s + 0}'; }
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | blocks)
packed=$(find "$PACK" -type f -printf '%s\n' | blocks)
total=$((tracked + packed))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "pack: repository $(mib "$tracked") + $PACK $(mib "$packed") = $(mib "$total") of $(mib "$LIMIT")"
find "$PACK" -type f -printf '  %p %s\n' | sort
if [ "$total" -gt "$LIMIT" ]; then
  echo "pack: too large for the GPU machine by $(mib $((total - LIMIT)))" >&2
  results=$(git ls-files -z benchmarks/results | xargs -0 stat -c %s 2>/dev/null | blocks)
  echo "pack: nothing the check runs reads benchmarks/results ($(mib "$results")); to leave it behind for the calls:" >&2
  echo "  echo /benchmarks/results/ >> .git/info/exclude && git rm -r -q --cached benchmarks/results" >&2
  echo "and after them: git reset -q benchmarks/results && sed -i '\\#^/benchmarks/results/\$#d' .git/info/exclude" >&2
  exit 1
fi
