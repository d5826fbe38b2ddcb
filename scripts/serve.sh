#!/usr/bin/env bash
# Sets up .venv and starts the service on its embedded default: SQLite under ./data, the API on
# http://127.0.0.1:8000 and one worker per local GPU (on a machine without a GPU, one worker on
# the Triton CPU interpreter, labelled as such: its timings are not GPU timings). It installs
# the runtime only (no test or lint tools), once: a warm start installs nothing
# (scripts/setup.sh --runtime; its stamp is keyed on pyproject.toml's hash).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --runtime
exec .venv/bin/tuner serve "$@"
