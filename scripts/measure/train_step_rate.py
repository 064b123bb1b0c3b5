"""Steps per second of a trainer, read from inside its own loop, for A/Bs of training code across
checkouts: the time from the first step's `on_step` callback to the last one's, so the set-up, the
step-0 evaluation and the first step (warm-up) are left out, and every checkpoint written in between
counts. Both the one-loop code and the trainers from before it (1ee0fad) call `on_step(step, metrics)`
after each step, so the same script measures either; run it with a checkout's own environment from
that checkout's root:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/measure/train_step_rate.py medusa train_heads \\
        target=MODELS/pycode/target split_file=MODELS/pycode/split.json output_dir=/tmp/x steps=60 ...
    ... train_step_rate.py draft train_draft target=... draft=... ...

The output folder is emptied first (a leftover checkpoint would resume). Prints one JSON line: the
trainer, the steps timed, their seconds and steps per second, and the checkout's git commit."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("medusa", "draft", "eagle"):
        print(__doc__)
        return 2
    kind, config, overrides = argv[0], argv[1], argv[2:]
    if kind == "medusa":
        from specdec.config import parse_overrides
        from specdec.heads.train import load_train_config, train_heads
        cfg, run = load_train_config(config, parse_overrides(overrides)), train_heads
    elif kind == "draft":
        from specdec.heads.distill import load_train_draft_config, train_draft
        cfg, run = load_train_draft_config(config, overrides), train_draft
    else:
        from specdec.heads.eagle_train import load_train_eagle_config, train_eagle
        cfg, run = load_train_eagle_config(config, overrides), train_eagle
    shutil.rmtree(cfg.output_dir, ignore_errors=True)
    stamps: list[float] = []
    run(cfg, on_step=lambda step, metrics: stamps.append(time.perf_counter()))
    seconds = stamps[-1] - stamps[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"trainer": kind, "commit": commit, "cwd": os.getcwd(), "steps": len(stamps) - 1,
                      "seconds": round(seconds, 3), "steps_per_s": round((len(stamps) - 1) / seconds, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
