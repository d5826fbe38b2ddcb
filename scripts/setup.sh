#!/usr/bin/env bash
# Creates .venv with everything the service needs (torch first: 2.13.0 is the CPU build on disk
# here; on a GPU machine set TUNER_TORCH_SPEC, e.g. "torch" for the CUDA build from PyPI).
# Usage: scripts/setup.sh [extra pip specs...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "${TUNER_TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]" "$@"
