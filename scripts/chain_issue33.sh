#!/usr/bin/env bash
# Issue 33: the trap comparison with a partial oracle warm-up, BFCL before/after and TextWorld's
# comparison (all eleven algorithms) in full mode, one after another with --records (each resumes from results/NAME and
# packs finished trials there every few minutes and on SIGTERM), beside scripts/chain_issue34.sh (which
# runs order_textworld and reward_textworld last), one worker each so the two never share a core.
#   WORKERS=1 nohup scripts/chain_issue33.sh >> runs/chain_issue33.log 2>&1 &
# Stop it with `touch runs/STOP33` (after the running sweep) or `pkill -f chain_issue33.sh` and then
# `pkill -TERM -f "seeupo sweep (compare_trap_oracle|bfcl_default|[a-z]*_textworld)"` (now;
# finished trials are packed), then commit results/.
set -u
cd "$(dirname "$0")/.."
mkdir -p runs/sweeps
for name in compare_trap_oracle bfcl_default compare_textworld; do
  [ -f runs/STOP33 ] && exit 0
  echo "=== $name $(date -u +%FT%TZ)"
  OMP_NUM_THREADS=1 .venv/bin/seeupo sweep "$name" --out "runs/sweeps/$name" --workers "${WORKERS:-1}" --records "results/$name"
done
