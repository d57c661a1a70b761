#!/usr/bin/env bash
# SeeUPO's factor weight on the tiny preset: full vs geometric, seeds 0-5 (SEEDS to choose), one
# thread per run (two can share the 2 cores). Resumable: finished runs are skipped.
#   scripts/factor_ratio_tiny.sh && .venv/bin/seeupo summarize runs/factor/*-s*
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p runs/factor
for seed in ${SEEDS:-0 1 2 3 4 5}; do for ratio in full geometric; do
  out=runs/factor/$ratio-s$seed
  [ -f "$out/summary.json" ] && continue
  rm -rf "$out"
  .venv/bin/seeupo train --preset tiny --seed "$seed" algo.factor_ratio=$ratio --out "$out" > "$out.log" 2>&1
done; done
