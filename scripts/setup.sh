#!/usr/bin/env bash
# Creates .venv with what is asked for (torch first: 2.13.0 is the CPU build on disk here; on a
# GPU machine set TUNER_TORCH_SPEC, e.g. "torch" for the CUDA build from PyPI).
#
#   scripts/setup.sh [--runtime] [--check] [extra pip specs...]
#
# Default: the package with its `dev` extra (the test and lint tools: scripts/test.sh).
# --runtime: the package with its `postgres` extra only, what serving needs (scripts/serve.sh).
# A set-up that succeeded is stamped in .venv (keyed on pyproject.toml's hash, the extra, the
# specs and TUNER_TORCH_SPEC): the same set-up again installs nothing (a warm `scripts/serve.sh`
# starts at once); a changed pyproject.toml installs again. TUNER_SETUP_FORCE=1: install anyway.
# --check: install nothing; say whether a set-up would install (exit 1) or not (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=dev check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) extra=postgres; shift ;;
    --check) check=1; shift ;;
    *) break ;;
  esac
done
hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
want="$hash .[$extra] ${TUNER_TORCH_SPEC:-torch==2.13.0} $*"
stamp=.venv/.tuner-setup
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "${TUNER_SETUP_FORCE:-0}" != 1 ] \
    && grep -qxF -- "$want" "$stamp"; then
  [ "$check" = 1 ] && echo "set-up is current: .[$extra]${*:+ $*}"
  exit 0
fi
if [ "$check" = 1 ]; then
  echo "would install: .[$extra]${*:+ $*}"
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "${TUNER_TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[$extra]" "$@"
# the package changed (another pyproject.toml): earlier stamps are stale
{ grep -F -- "$hash " "$stamp" 2>/dev/null || true; echo "$want"; } | sort -u > "$stamp.new"
mv "$stamp.new" "$stamp"
