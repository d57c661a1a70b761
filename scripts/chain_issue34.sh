#!/usr/bin/env bash
# Issue 34: the turn-level credit experiments in full mode, then issue 33's TextWorld order and reward
# experiments, one after another with --records (each resumes from results/NAME and packs finished
# trials there every few minutes and on SIGTERM), one worker, beside scripts/chain_issue33.sh (no two
# torch jobs share a core):
#   WORKERS=1 nohup scripts/chain_issue34.sh >> runs/chain_issue34.log 2>&1 &
# Stop it with `touch runs/STOP34` (after the running sweep) or `pkill -f chain_issue34.sh` and then
# `pkill -TERM -f "seeupo sweep ([a-z_]*_turn|order_textworld|reward_textworld|compare_textworld)"` (now;
# finished trials are packed), then commit results/.
# Once its own experiments are done it joins compare_textworld as a second worker on the same study
# (the sweep engine hands each trial to one worker; both restore and pack records, and a trial packed
# twice is restored once), so the two cores share the longest experiment.
set -u
cd "$(dirname "$0")/.."
mkdir -p runs/sweeps
for name in compare_turn robustness_turn compare_trap_turn order_textworld reward_textworld; do
  [ -f runs/STOP34 ] && exit 0
  echo "=== $name $(date -u +%FT%TZ)"
  extra=()  # order_textworld's reverse arm is compare_textworld's seeupo arm (the same definition)
  [ "$name" = order_textworld ] && extra=(--reuse-records results/compare_textworld)
  OMP_NUM_THREADS=1 .venv/bin/seeupo sweep "$name" --out "runs/sweeps/$name" --workers "${WORKERS:-1}" --records "results/$name" "${extra[@]}"
done
[ -f runs/STOP34 ] && exit 0
echo "=== compare_textworld (second worker) $(date -u +%FT%TZ)"
OMP_NUM_THREADS=1 .venv/bin/seeupo sweep compare_textworld --out runs/sweeps/compare_textworld --workers "${WORKERS:-1}" --records results/compare_textworld
