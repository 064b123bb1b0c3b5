#!/usr/bin/env bash
# The train-draft ablation: loss (fkl / rkl / jsd / tvd) x data (fixed text / on-policy draft samples),
# each run from ../shared/models/pycode/draft with the same time budget (MINUTES of training), one after
# another, then the plot and table (benchmarks/distill_plot.py). Run from the repository root:
#   MINUTES=2.5 OUT=/work/artifacts/distill-ablation bash benchmarks/results/distill/run_ablation.sh
set -euo pipefail
MINUTES=${MINUTES:-2.5}
OUT=${OUT:-../distill-ablation}
PY=${PY:-.venv/bin/python}
for data in fixed draft; do
  for loss in fkl rkl jsd tvd; do
    run="$OUT/$loss-$data"
    echo "== $loss / $data -> $run"
    nice -n 5 "$PY" -m specdec.cli train-draft train_draft loss=$loss data=$data max_minutes=$MINUTES \
      eval_interval=10 checkpoint_interval=1000 progress=false output_dir="$run" 2>&1 \
      | grep -v -e "^Loading weights" -e "^Writing model" || true
  done
done
"$PY" -m specdec.benchmarks.distill_plot "$OUT" --out benchmarks/results/distill
