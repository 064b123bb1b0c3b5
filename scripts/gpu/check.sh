#!/usr/bin/env bash
# The GPU check: one prepared run that proves specdec on a CUDA GPU and measures it, in about eight
# minutes on an H100. Every step has its own time limit, writes its log, and a failed step does not
# stop the next; $OUT/summary.md says what each step gave.
#
#   bash scripts/gpu/pack.sh --models MODELS/pycode   # here, beforehand: wheels + models into gpu-pack/
#   bash scripts/gpu/check.sh                         # there, from the repository root
#   bash scripts/gpu/check.sh --dry-run               # any machine, CPU, tiny random models, ~3 minutes
#   bash scripts/gpu/check.sh --quick --steps cuda_syncs,bench   # a second look: some steps, smaller
#
# Steps: (0) install the packed wheels with --no-deps onto the machine's own torch and transformers,
# unpack the models; (1) environment; (2) the CUDA tests (every strategy under sync-debug mode
# "error", greedy identity and the exact law on the device, compile with CUDA graphs, a target with
# linear-attention layers verified on chains); (3) an EAGLE
# drafter trained for the target on the GPU (a minute); (4) bf16 greedy identity for every strategy,
# each difference classified (an exact top-2 tie, a tie within one bf16 unit, or a mismatch); (5) `specdec bench`: every strategy with Hugging Face's rows, greedy
# and T = 0.8, one sequence; (6) peak GPU memory against Hugging Face's plain generate() at 1k- and
# 8k-token prompts; (7) the bench at batch 1 and 8; (8) `compile: true` against eager. The whole
# run keeps to CHECK_BUDGET seconds (default 480): a step that would pass it is cut short.
# Output: $OUT (default gpu-out/) holds summary.md, check.log (every step's output) and
# results.tar.gz (the bench folders, the JSON of each step); fewer than eight files, as the GPU
# tool brings back.
set -uo pipefail
cd "$(dirname "$0")/../.."
DRY=0 QUICK=0 STEPS=all
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --quick) QUICK=1; shift ;;          # smaller sizes: a second look within a few minutes
    --steps) STEPS=",$2,"; shift 2 ;;   # e.g. --steps cuda_syncs,bench: only these (set-up always runs)
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK"
LOG="$OUT/check.log"
SUMMARY="$OUT/summary.md"
: >"$LOG"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ "$DRY" = 1 ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
# -P: import specdec from what is installed (the packed wheel, or the venv), not from the checkout's
# folders, which hold only part of the package (strategies/, heads/... sit beside specdec/)
RUN="$PY -P"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if [ "$DRY" = 1 ]; then
  DEVICE=cpu; DTYPE=bfloat16
  SIZE=(prompts.num=1 prompts.tokens=48 max_new_tokens=8 warmup_tokens=4)
  TRAIN=(steps=3 max_minutes=null seq_len=64 batch_size=2 eval_windows=2 eval_new_tokens=16 eval_interval=3
         'corpus=[json]' split_file=null)
  MEMORY=(--lengths 128)
  COMPILE_ROWS=(only=[autoregressive])     # one compiled row: inductor's C++ build takes a minute a graph on a CPU
  IDENTITY=(--prompts 1 --prompt-tokens 48 --new 8)
else
  DEVICE=cuda; DTYPE=bfloat16
  SIZE=()
  TRAIN=(steps=100000 max_minutes=1.0 seq_len=256 batch_size=32 eval_windows=8 eval_new_tokens=64
         eval_interval=100000)
  MEMORY=(--lengths 1024 8192)
  COMPILE_ROWS=()
  IDENTITY=(--prompts 3 --prompt-tokens 256 --new 96)
  if [ "$QUICK" = 1 ]; then
    # greedy rows only: the full bench's two temperatures outran the step's limit on an H100
    SIZE=(prompts.num=1 max_new_tokens=64 'temperatures=[0.0]')
    IDENTITY=(--prompts 2 --prompt-tokens 256 --new 64)
  fi
fi

echo "| step | status | seconds |" >"$SUMMARY"
echo "|---|---|---|" >>"$SUMMARY"
# The whole run's budget (seconds): a step gets its own limit or what is left of the budget, less
# the time to pack the results, whichever is smaller; one with under 10 s left is skipped.
BUDGET="${CHECK_BUDGET:-480}"
step() {   # step NAME SECONDS COMMAND...: run with a time limit, log it, add a summary row
  local name="$1" limit="$2"; shift 2
  if [ "$STEPS" != all ] && [ "$name" != setup ] && [[ "$STEPS" != *",$name,"* ]]; then
    return 0
  fi
  local start=$SECONDS status left=$((BUDGET - SECONDS - 15))
  if [ "$left" -lt 10 ]; then
    echo "| $name | skipped: the run's ${BUDGET}s budget is spent | 0 |" >>"$SUMMARY"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "===== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" >>"$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out after ${limit}s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  echo "| $name | $status | $((SECONDS - start)) |" >>"$SUMMARY"
  echo "===== $name: $status in $((SECONDS - start))s" >>"$LOG"
  return 0
}

# (0) set-up: models and, on the GPU machine, the packed wheels
MODELS="$WORK/models"
if [ "$DRY" = 1 ]; then
  step setup 120 $RUN scripts/gpu/tiny_family.py "$MODELS"
  SPLIT=null
else
  setup() {
    [ -d gpu-pack/wheels ] || { echo "no gpu-pack/: run scripts/gpu/pack.sh --models MODELS/pycode here first"; return 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/specdec-site gpu-pack/wheels/*.whl || return 1
    mkdir -p "$MODELS"
    for part in target draft; do
      [ -d "gpu-pack/models/$part" ] || continue
      mkdir -p "$MODELS/$part" && cp gpu-pack/models/$part/*.json "$MODELS/$part/" || return 1
      "$PY" scripts/gpu/planes.py unpack "gpu-pack/models/$part/model.planes" "$MODELS/$part/model.safetensors" || return 1
    done
    # the split's files that this machine's standard library has (another Python version may lack some)
    "$PY" scripts/gpu/local_split.py gpu-pack/models/split.json "$MODELS/split.json"
  }
  export -f setup
  export PY MODELS
  step setup 120 bash -c setup
  export PYTHONPATH="/tmp/specdec-site${PYTHONPATH:+:$PYTHONPATH}"
  SPLIT="$MODELS/split.json"
fi
TARGET="$MODELS/target"
DRAFT="$MODELS/draft"
EAGLE="$WORK/eagle"
# a drafter trained by an earlier run, packed with the models, stands in when training is not run
if [[ "$DRY" = 0 && "$STEPS" != all && "$STEPS" != *",train_eagle,"* && -d gpu-pack/models/eagle ]]; then
  EAGLE="$(pwd)/gpu-pack/models/eagle"
fi

# The machine's pace while the steps run, sampled each second: the GPU's clocks, load, power and
# throttle reasons, and the host's CPU counters (/proc/stat: steal is the 8th number). Both H100
# leases saw the same forward run 10-30x slower for a minute and then fast again, in Hugging Face's
# rows as in ours; these logs say whether the GPU or the host was slowed.
MONITORS=()
if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -l 1 >"$WORK/monitor_gpu.csv" 2>&1 &
  MONITORS+=($!)
fi
(while :; do echo "$(date -u +%H:%M:%S) $(head -1 /proc/stat)"; sleep 1; done) >"$WORK/monitor_cpu.txt" 2>/dev/null &
MONITORS+=($!)

# (1) environment
step environment 60 bash -c "$RUN scripts/gpu/env_report.py > '$WORK/environment.json'; cat '$WORK/environment.json'; nvidia-smi || true"

# (2) the CUDA tests (on the dry run: the same files on the CPU; the sync test skips there)
TESTS=(-m pytest -q -rfE -p no:cacheprovider -o addopts="")
step cuda_syncs 100 env SPECDEC_TEST_DEVICE=$DEVICE $RUN "${TESTS[@]}" tests/test_cuda_syncs.py \
  --junitxml="$WORK/cuda_syncs.xml"
step device_tests 100 env SPECDEC_TEST_DEVICE=$DEVICE $RUN "${TESTS[@]}" tests/test_device.py \
  --junitxml="$WORK/device_tests.xml"
# a target with linear-attention layers (Qwen3-Next, tiny): chains, the state's rollback, auto's chain plans
step recurrent_tests 100 env SPECDEC_TEST_DEVICE=$DEVICE $RUN "${TESTS[@]}" tests/test_recurrent_target.py \
  --junitxml="$WORK/recurrent_tests.xml"

# (3) an EAGLE drafter for the target (one minute of training; loading, the last evaluation and the save
# come on top, 80-100 s in all on an H100)
step train_eagle 120 $RUN -m specdec.cli train-heads train_eagle target="$TARGET" output_dir="$EAGLE" \
  split_file="$SPLIT" device=$DEVICE bf16=null progress=false "${TRAIN[@]}"

# (4) bf16 greedy identity, ties counted
step bf16_identity 120 bash -c "$RUN scripts/gpu/bf16_identity.py --target '$TARGET' --draft '$DRAFT' \
  --eagle '$EAGLE' --split '$SPLIT' --device $DEVICE --dtype $DTYPE ${IDENTITY[*]} > '$WORK/bf16_identity.jsonl'"

# (5) the bench, one sequence
MODEL_ARGS=(models.target="$TARGET" models.draft="$DRAFT" models.eagle="$EAGLE" models.device=$DEVICE
            models.dtype=$DTYPE prompts.split="$SPLIT")
step bench 200 $RUN -m specdec.cli bench scripts/gpu/bench.yaml "${MODEL_ARGS[@]}" output_dir="$WORK/bench" \
  progress=false "${SIZE[@]}"
# (6) peak memory against Hugging Face's plain generate()
step memory 90 bash -c "SPECDEC_PYCODE_TARGET='$TARGET' $RUN scripts/measure/prefill_memory.py --device $DEVICE \
  --runners hf autoregressive ${MEMORY[*]} > '$WORK/memory.txt'; cat '$WORK/memory.txt'"
# (7) the bench at batch 1 and 8
step bench_batch 80 $RUN -m specdec.cli bench scripts/gpu/bench_batch.yaml "${MODEL_ARGS[@]}" \
  output_dir="$WORK/bench_batch" progress=false "${SIZE[@]}"

# (8) compile: true against eager (compiling CUDA graphs for each bucket takes a while: last)
step bench_compile 100 $RUN -m specdec.cli bench scripts/gpu/bench_compile.yaml "${MODEL_ARGS[@]}" \
  output_dir="$WORK/bench_compile" progress=false "${SIZE[@]}" "${COMPILE_ROWS[@]}"

kill "${MONITORS[@]}" 2>/dev/null
rm -rf "$MODELS" "$EAGLE"/*checkpoint* 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C "$WORK" . && rm -rf "$WORK"
cat "$SUMMARY"
! grep -q "failed\|timed out" "$SUMMARY"
