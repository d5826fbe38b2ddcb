#!/usr/bin/env bash
# The GPU tests (tests/gpu, marked `gpu`; the default run deselects them) on a CUDA machine,
# with the GPUs' state (clocks, power, temperature, throttle reasons, processes) before and
# after. All output goes to OUT_DIR/gpu_tests.txt; the exit status is pytest's.
#
#   scripts/gpu_tests.sh OUT_DIR [TEST ...]   # default: all of tests/gpu
#
# Needs python3 (PYTHON=...) with the CUDA builds of torch and triton, pytest and pytest-timeout
# (all in the device machine's image), nvidia-smi, and the project's other packages: optuna,
# sqlalchemy, alembic, pydantic, pydantic-settings, httpx, tqdm (the tests import the tuner and
# tests/conftest.py; the SIGKILL test runs `tuner tune` on a SQLite file). On the device machine
# they come from wheels: when they do not import and a .whl folder is here (carried), they are
# installed from it into /tmp/site and put on PYTHONPATH, as the device notes describe.
# Takes ~2-4 minutes on an H200 (small shapes, few trials).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_tests.sh OUT_DIR [TEST ...]}
shift
TESTS=("$@")
[ ${#TESTS[@]} -eq 0 ] && TESTS=(tests/gpu)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_tests.txt") 2>&1

. scripts/carried_wheels.sh
need_packages 'import optuna, sqlalchemy, alembic, pydantic_settings, httpx, tqdm, pytest, pytest_timeout'

# the root conftest selects Triton's CPU interpreter unless TUNER_TEST_GPU=1
export TUNER_TEST_GPU=1 PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

gpu_state() {
  nvidia-smi --query-gpu=index,name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,memory.used,memory.total \
    --format=csv
  nvidia-smi --query-gpu=index,clocks_event_reasons.active --format=csv 2>/dev/null \
    || nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv
  echo "processes on the GPUs:"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
}

echo "== $(date -u +%FT%TZ) $PY -m pytest -m gpu ${TESTS[*]} -q -rA"
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
"$PY" -c 'import sys, torch, triton; print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")'
nvidia-smi -L
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
echo "== GPU state before"
gpu_state
start=$(date +%s)
"$PY" -m pytest -m gpu "${TESTS[@]}" -q -rA -p no:cacheprovider --durations=0
status=$?
echo "== GPU state after ($(( $(date +%s) - start )) s; pytest exit status $status)"
gpu_state
exit $status
