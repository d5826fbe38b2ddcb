#!/usr/bin/env bash
# From nothing to a passing test run: system packages for the browser and compose tests, the
# virtualenv, lint, types, then the test suite (PostgreSQL tests too when a server answers).
#
# scripts/test.sh --fast: the fast tier while developing (an existing .venv, lint, and the suite
# without the tests measured slow in tests/slow_tests.txt; under 3 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  shift
  [ -x .venv/bin/python ] || scripts/setup.sh playwright
  .venv/bin/ruff check tuner search_spaces api db tests bench examples
  if [ -z "${TUNER_TEST_POSTGRES_URL:-}" ] && command -v pg_isready >/dev/null \
      && pg_isready -q -h 127.0.0.1 -p 5432; then
    export TUNER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test
  fi
  exec .venv/bin/python -m pytest -q -m "not gpu and not slow" "$@"
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  need=""
  command -v chromium >/dev/null || need="$need chromium"
  command -v docker-compose >/dev/null || need="$need docker-compose"
  if [ -n "$need" ]; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need) \
      >/tmp/tuner-apt.log 2>&1 || echo "warning: apt-get install$need failed (see /tmp/tuner-apt.log)"
  fi
fi
scripts/setup.sh playwright
.venv/bin/ruff check tuner search_spaces api db tests bench examples
.venv/bin/mypy tuner search_spaces api db
if [ -z "${TUNER_TEST_POSTGRES_URL:-}" ] && command -v pg_isready >/dev/null \
    && pg_isready -q -h 127.0.0.1 -p 5432; then
  export TUNER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test
fi
exec .venv/bin/python -m pytest -q "$@"
