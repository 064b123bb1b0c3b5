#!/bin/bash
# Medusa heads (60 steps) and draft distillation (20 steps): steps/s before (a checkout of 1ee0fad with its own
# .venv, BEFORE=) and after (AFTER=, default this checkout) the one training loop, interleaved: the rounds
# alternate which goes first. One torch thread each, one run at a time; each line of output is one run (JSON):
#   BEFORE=/path/to/checkout-of-1ee0fad MODELS=../shared/models bash benchmarks/results/training_loop/medusa_draft_ab.sh
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BEFORE=${BEFORE:?a checkout of 1ee0fad with its own .venv}; AFTER=${AFTER:-$ROOT}
M=$(cd "${MODELS:-$ROOT/../shared/models}" && pwd)/pycode
S=$ROOT/scripts/measure/train_step_rate.py
run() {  # checkout trainer args...
  local dir=$1; shift
  (cd "$dir" && OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python "$S" "$@" 2>/dev/null | tail -1)
}
medusa() { run "$1" medusa train_heads target=$M/target split_file=$M/split.json output_dir=/tmp/loopab_medusa_$2 \
             steps=60 eval_interval=1000 eval_windows=2 progress=false; }
draft() { run "$1" draft train_draft target=$M/target draft=$M/draft split_file=$M/split.json \
            output_dir=/tmp/loopab_draft_$2 steps=20 max_minutes=null eval_interval=1000 eval_windows=2 eval_prompts=0 \
            progress=false; }
for trainer in medusa draft; do
  for round in 1 2 3; do
    if [ $((round % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for v in $order; do
      dir=$AFTER; [ $v = before ] && dir=$BEFORE
      echo "{\"round\": $round, \"version\": \"$v\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"result\": $($trainer "$dir" $v)}"
    done
  done
done
