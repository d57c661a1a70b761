#!/usr/bin/env bash
# Issue 32: the full-mode sweeps whose trial records were lost, run again one after another with
# --records (each resumes from results/NAME and packs finished trials there every few minutes and on
# SIGTERM). Stop it with `touch runs/STOP` (after the running sweep) or
# `pkill -TERM -f "seeupo sweep"` (now; finished trials are packed), then commit results/.
#   WORKERS=2 nohup scripts/rerun_records.sh >> runs/rerun_records.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
mkdir -p runs/sweeps
for name in order norm factor compare compare_trap adapters fair compare_default; do
  [ -f runs/STOP ] && exit 0
  echo "=== $name $(date -u +%FT%TZ)"
  .venv/bin/seeupo sweep "$name" --out "runs/sweeps/$name" --workers "${WORKERS:-2}" --records "results/$name"
done
