#!/bin/bash
# Steps/s of train_eagle (EAGLE-1), train_eagle3 (ttt 2) and train_eagle3 ttt_steps=7, 40 steps each, two
# interleaved rounds (the order reversed in the second), one torch thread, one run at a time.
M=$(cd "${MODELS:-../shared/models}" && pwd)/pycode; cd "$(dirname "$0")/../../../.."
run() { OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python scripts/measure/train_step_rate.py eagle "$@" target=$M/target \
  split_file=$M/split.json steps=40 eval_interval=1000 eval_windows=1 eval_new_tokens=8 progress=false 2>/dev/null | tail -1; }
for round in 1 2; do
  if [ $round -eq 1 ]; then order="e1 e3 e3t7"; else order="e3t7 e3 e1"; fi
  for v in $order; do
    case $v in e1) a="train_eagle";; e3) a="train_eagle3";; e3t7) a="train_eagle3 ttt_steps=7";; esac
    echo "{\"round\": $round, \"arm\": \"$v\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"result\": $(run $a output_dir=/tmp/rate_$v)}"
  done
done
