#!/usr/bin/env bash
# Held-out matmul replay tables over the WHOLE space, then search quality on them.
#
#   bench/holdout_tables.sh OUT_DIR
#
# Records SHAPES (default: 4 matmul problems in no table of tests/data/replay: a square-ish
# deep-K 1536x1536x6144 fp16, an odd 3000x1000x2000 fp16 (its bf16 table in holdout/ holds the
# feasible configs only, cut at 768), a decode-like 64x8192x4096 bf16 and a shallow-K
# 2048x2048x512 bf16) with bench/record_tables.py on the GPU: every config of the kernel's space,
# the ones its constraints prune included and marked with the constraint's reason (so a search
# evaluated on a table is scored against the optimum of the whole space, and a constraint that
# prunes the optimum shows up as "optimum pruned" in the report), each through the product's
# pipeline (compile pool, measuring child, verification, do_bench with the L2 flushed), in a
# seeded random order. Then bench/search_quality.py (CPU) over the new tables.
#
# Time: TOTAL_SECONDS (330) of recording from this script's start, shared in order; a table may
# take TABLE_SECONDS (75; the batch in flight and the torch baseline add ~10-20 s) and leaves
# RESERVE_SECONDS (75) to each table after it, so the four get about equal shares. A table cut
# by its limit is still written and says so ("coverage", "timing"): a seeded random sample, so
# its optimum is the sample's. The whole space is 1,920 configs, a sixth of which spill the
# accumulator and compile for 5-30 s: COMPILE_TIMEOUT (8 s) records those as timeouts (such
# configs ran 3.3-11.8x slower than the best on every earlier H200 table). For complete tables
# of all four, TOTAL_SECONDS=560 TABLE_SECONDS=125 RESERVE_SECONDS=125 (one 10-minute call).
# Search quality: STRATEGIES (model,model-tpe,tpe,random), SEEDS (10) on every core; ~1 min.
#
# Writes into OUT_DIR: the tables (matmul_<M>x<N>x<K>_<dtype>_<gpu>.json), record_holdout.log,
# search_quality_holdout.md. Needs python3 (PYTHON=...) with the CUDA torch and triton, and
# optuna and scipy: when they do not import and a .whl folder is here, they are installed from it
# into /tmp/site. Dry run on a CPU: BACKEND=interpret SHAPES="M=16,N=32,K=32:float16" (a 1,920-
# config space takes minutes on the interpreter: set TABLE_SECONDS).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench/holdout_tables.sh OUT_DIR}
PY=${PYTHON:-python3}
TOTAL=${TOTAL_SECONDS:-330}
CAP=${TABLE_SECONDS:-75}
RESERVE=${RESERVE_SECONDS:-75}
BACKEND=${BACKEND:-cuda}
SHAPES=${SHAPES:-"M=1536,N=1536,K=6144:float16;M=3000,N=1000,K=2000:float16;M=64,N=8192,K=4096:bfloat16;M=2048,N=2048,K=512:bfloat16"}
mkdir -p "$OUT"
exec > >(tee "$OUT/record_holdout.log") 2>&1
START=$(date +%s)

. scripts/carried_wheels.sh
need_packages 'import optuna, scipy, torch, triton'
unset TRITON_INTERPRET  # an interpret child sets it for itself
export PYTHONUNBUFFERED=1

echo "== $(date -u +%FT%TZ) held-out matmul tables over the whole space into $OUT on $BACKEND:" \
  "$TOTAL s, <= $CAP s a table, $RESERVE s kept for each later one"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.draw,temperature.gpu \
  --format=csv,noheader 2>/dev/null
echo "\$ $PY -m bench.record_tables --kernel matmul --shapes '$SHAPES' --out-dir $OUT" \
  "--backend $BACKEND --limit-seconds $CAP --total-seconds $TOTAL --reserve-seconds $RESERVE" \
  "--compile-timeout ${COMPILE_TIMEOUT:-8}"
"$PY" -m bench.record_tables --kernel matmul --shapes "$SHAPES" --out-dir "$OUT" \
  --backend "$BACKEND" --limit-seconds "$CAP" --total-seconds "$TOTAL" \
  --reserve-seconds "$RESERVE" --compile-timeout "${COMPILE_TIMEOUT:-8}"
status=$?
echo "== $(date -u +%T) recorded in $(( $(date +%s) - START )) s (status $status)"

"$PY" -m bench.record_tables --summary --out-dir "$OUT"

tables=("$OUT"/matmul_*.json)
[ -e "${tables[0]}" ] || { echo "no table was written"; exit 1; }
echo "== $(date -u +%T) search quality on ${#tables[@]} tables"
"$PY" -m bench.search_quality --tables-dir '' --strategies "${STRATEGIES:-model,model-tpe,tpe,random}" \
  --seeds "${SEEDS:-10}" --slow-seeds "${SLOW_SEEDS:-2}" --jobs "$(nproc)" \
  --out "$OUT/search_quality_holdout.md" "${tables[@]}" >/dev/null || status=1
sed -n '/^| table | kernel/,/^$/p;/^### cold/,/^### warm/p' "$OUT/search_quality_holdout.md"
echo "== $(date -u +%T) done in $(( $(date +%s) - START )) s"
exit $status
