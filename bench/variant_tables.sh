#!/usr/bin/env bash
# Replay tables of matmul over its WHOLE space with every variant (issue 13): a seeded uniform
# random sample of the space's distinct kernels, the same sample for every shape.
#
#   bench/variant_tables.sh OUT_DIR
#
# matmul's space is 120,000 configs: 21,600 distinct kernels on an aligned problem (SPLIT_K is
# split_k's alone, ALIGN=1 copies nothing there: record_tables' same_kernel), 43,200 on an
# unaligned one. Compiling them all takes over an hour of a 16-core machine (a sixth spill the
# accumulator and compile for 5-30 s), so each table is a sample: the first N kernels of one
# seeded shuffle of the whole space, what the constraints would prune included and marked with
# the reason. It is drawn before, and independently of, any search: no constraint, prior or
# known-good list chooses it.
#
# The first shape pays the compiles: it measures the sample's kernels in the seeded order for
# up to FIRST_SECONDS (300) or SAMPLE (3000) kernels, whichever ends first. Each later shape
# (one dtype and alignment: the same binaries, from Triton's cache) then measures exactly the
# kernels the first one reached (--sample of its count), sharing what is left of TOTAL_SECONDS
# (540, from this script's start). Search quality over the tables runs on any CPU afterwards:
#   python3 -m bench.search_quality --tables-dir '' --out FILE.md OUT_DIR/*.json
#
# SHAPES (default: three bf16 problems, each with a tutorial-kernel table of its own in
# tests/data/replay: square 2048^3, decode-like 32x14336x4096, large-MN shallow-K
# 8192x8192x1024); COMPILE_TIMEOUT (8 s): a kernel compiling longer is recorded as a timeout.
# Writes the tables and variant_tables.log into OUT_DIR. Needs python3 (PYTHON=...) with the
# CUDA torch and triton; when optuna does not import and a .whl folder is here, the wheels are
# installed into /tmp/site. Dry run on a CPU: BACKEND=interpret SAMPLE=4
# SHAPES="M=16,N=32,K=32:float16;M=48,N=64,K=32:float16".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench/variant_tables.sh OUT_DIR}
PY=${PYTHON:-python3}
TOTAL=${TOTAL_SECONDS:-540}
FIRST=${FIRST_SECONDS:-300}
SAMPLE=${SAMPLE:-3000}
BACKEND=${BACKEND:-cuda}
TIMEOUT=${COMPILE_TIMEOUT:-8}
SHAPES=${SHAPES:-"M=2048,N=2048,K=2048:bfloat16;M=32,N=14336,K=4096:bfloat16;M=8192,N=8192,K=1024:bfloat16"}
mkdir -p "$OUT"
exec > >(tee "$OUT/variant_tables.log") 2>&1
START=$(date +%s)

. scripts/carried_wheels.sh
need_packages 'import optuna, torch, triton'
unset TRITON_INTERPRET  # an interpret child sets it for itself
export PYTHONUNBUFFERED=1

record() {  # shapes, extra arguments
  echo "\$ $PY -m bench.record_tables --kernel matmul --shapes '$1' --out-dir $OUT" \
    "--backend $BACKEND --compile-timeout $TIMEOUT ${*:2}"
  "$PY" -m bench.record_tables --kernel matmul --shapes "$1" --out-dir "$OUT" \
    --backend "$BACKEND" --compile-timeout "$TIMEOUT" "${@:2}"
}

echo "== $(date -u +%FT%TZ) matmul variant tables into $OUT on $BACKEND: a sample of <= $SAMPLE" \
  "kernels, the first shape <= $FIRST s, $TOTAL s in all"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv,noheader 2>/dev/null
first=${SHAPES%%;*}
rest=${SHAPES#"$first"}
rest=${rest#;}
record "$first" --sample "$SAMPLE" --limit-seconds "$FIRST"
status=$?
n=$("$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
tables = sorted(Path(sys.argv[1]).glob("matmul_*.json"), key=lambda p: p.stat().st_mtime)
print(json.loads(tables[-1].read_text())["coverage"]["measured"] if tables else 0)
PY
)
echo "== $(date -u +%T) the first shape reached $n kernels in $(( $(date +%s) - START )) s"
if [ -n "$rest" ] && [ "$n" -gt 0 ]; then
  left=$(( TOTAL - ($(date +%s) - START) ))
  count=$(tr ';' '\n' <<<"$rest" | grep -c .)
  record "$rest" --sample "$n" --limit-seconds "$left" --total-seconds "$left" \
    --reserve-seconds $(( left / (count + 1) )) || status=1
fi
echo "== $(date -u +%T) recorded in $(( $(date +%s) - START )) s (status $status)"
"$PY" -m bench.record_tables --summary --out-dir "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv,noheader 2>/dev/null
exit $status
