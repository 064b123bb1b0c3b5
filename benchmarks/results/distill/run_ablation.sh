#!/usr/bin/env bash
# The train-draft ablation: loss (fkl / rkl / jsd / tvd) x data (fixed text / on-policy draft samples),
# each run from ../shared/models/pycode/draft with the same time budget (MINUTES of training), JOBS runs
# at a time (each on one torch thread, the config's `threads: 1`: on a 2-core CPU JOBS=2 gives every run
# one core), then the plot and table (benchmarks/distill_plot.py). Run from the repository root:
#   MINUTES=4 JOBS=2 OUT=/work/artifacts/distill-ablation bash benchmarks/results/distill/run_ablation.sh
set -euo pipefail
MINUTES=${MINUTES:-2.5}
JOBS=${JOBS:-1}
OUT=${OUT:-../distill-ablation}
PY=${PY:-.venv/bin/python}
export MINUTES OUT PY
one_run() {
  loss=$1; data=$2; run="$OUT/$loss-$data"
  echo "== $loss / $data -> $run"
  nice -n 5 "$PY" -m specdec.cli train-draft train_draft loss=$loss data=$data max_minutes=$MINUTES \
    eval_interval=10 checkpoint_interval=1000 progress=false output_dir="$run" 2>&1 \
    | grep -v -e "^Loading weights" -e "^Writing model" || true
}
export -f one_run
for data in fixed draft; do for loss in fkl rkl jsd tvd; do echo "$loss $data"; done; done \
  | xargs -P "$JOBS" -L 1 bash -c 'one_run $0 $1'
"$PY" -m specdec.benchmarks.distill_plot "$OUT" --out benchmarks/results/distill
