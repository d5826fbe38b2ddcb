#!/usr/bin/env bash
# Exhaustive replay tables of the non-GEMM kernels on the GPU, unattended, in <= 8 minutes:
# softmax, rmsnorm and bias_gelu. Every config of each kernel's WHOLE space (what its constraints
# would prune included) goes through the product's pipeline (bench/record_tables.py).
#
#   bench/nongemm_tables.sh [OUT_DIR]      # default tests/data/replay/nongemm
#
# rmsnorm and bias_gelu are the plugin examples of examples/: when they are not registered
# already (TUNER_KERNELS or an installed entry point), this script registers them the way a
# user does (TUNER_KERNELS=module:KERNEL with the folder on PYTHONPATH); REGISTER_EXAMPLES=0
# leaves them out instead.
#
# Time: TOTAL_SECONDS (420) from the start of this script to the last table's limit, shared by
# the tables in order; a table may take at most TABLE_SECONDS (100) and leaves RESERVE_SECONDS
# (30) to each table after it; one cut by its limit is still written, marked as cut
# ("coverage", "timing"). After the deadline only the last table's batch in flight, its torch
# baseline and the summary remain (~10-30 s). COMPILE_TIMEOUT (15 s): a config compiling longer
# is recorded as a timeout.
# Log: bench/results/record_nongemm_h200.log (LOG=...). For a dry run on a CPU:
# BACKEND=interpret SOFTMAX_SHAPES="M=4,N=33:float32" ... (RMSNORM_SHAPES, BIAS_GELU_SHAPES).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-tests/data/replay/nongemm}
TOTAL=${TOTAL_SECONDS:-420}
CAP=${TABLE_SECONDS:-100}
RESERVE=${RESERVE_SECONDS:-30}
BACKEND=${BACKEND:-cuda}
LOG=${LOG:-bench/results/record_nongemm_h200.log}
# Memory-bound shapes where the launch config matters: rows in one block or several, short rows
# (rows per program), a vocabulary-wide row whose length is odd (no aligned vector loads).
SOFTMAX_SHAPES=${SOFTMAX_SHAPES:-"M=4096,N=8192:float16;M=8192,N=50257:bfloat16;M=32768,N=1024:float16"}
RMSNORM_SHAPES=${RMSNORM_SHAPES:-"M=4096,N=8192:float16;M=16384,N=4096:bfloat16;M=32768,N=1024:float16"}
BIAS_GELU_SHAPES=${BIAS_GELU_SHAPES:-"M=4096,N=14336:bfloat16;M=16384,N=4096:float16;M=32768,N=1024:float16"}
mkdir -p "$OUT" "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
unset TRITON_INTERPRET
START=$(date +%s)

echo "== $(date -u +%FT%TZ) non-GEMM tables into $OUT on $BACKEND: budget $TOTAL s," \
  "<= $CAP s a table"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

registered=$("$PY" -c 'from search_spaces import kernel_names; print(" ".join(kernel_names()))')
add_example() {  # name, module:attr, folder
  case " $registered " in *" $1 "*) return;; esac
  if [ "${REGISTER_EXAMPLES:-1}" = 1 ] && [ -d "$3" ]; then
    export PYTHONPATH="$PWD/$3${PYTHONPATH:+:$PYTHONPATH}"
    export TUNER_KERNELS="${TUNER_KERNELS:+$TUNER_KERNELS,}$2"
    echo "registering the example $1 as a user does: TUNER_KERNELS=$2, $3 on PYTHONPATH"
  fi
}
add_example rmsnorm tuner_example_rmsnorm:KERNEL examples/rmsnorm
add_example bias_gelu bias_gelu:KERNEL examples/bias_gelu
echo "TUNER_KERNELS=${TUNER_KERNELS:-}"

# The plan, one line per record_tables run: kernel<TAB>shapes. Round 1 records the first
# ROUND1 (2) shapes of every registered kernel, round 2 the rest, so that a run short of time
# cuts a kernel's last shape, not a whole kernel. Shapes of a dtype the kernel lacks are left out.
PLAN=$("$PY" - "${ROUND1:-2}" "softmax=$SOFTMAX_SHAPES" "rmsnorm=$RMSNORM_SHAPES" \
  "bias_gelu=$BIAS_GELU_SHAPES" <<'PY'
import sys

from search_spaces import get_kernel, plugin_errors

first = int(sys.argv[1])
rounds: list[list[str]] = [[], []]
for arg in sys.argv[2:]:
    name, _, spec = arg.partition("=")
    try:
        kernel = get_kernel(name)
    except Exception as exc:  # noqa: BLE001
        print(f"skip {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        continue
    shapes = [s for s in spec.split(";") if s.strip()]
    keep = [s for s in shapes if s.rpartition(":")[2] in kernel.dtypes]
    for s in sorted(set(shapes) - set(keep)):
        print(f"skip {name} {s}: its dtypes are {kernel.dtypes}", file=sys.stderr)
    print(f"{name}: {kernel.space().size()} configs in its space, {len(keep)} shapes",
          file=sys.stderr)
    for i, part in enumerate((keep[:first], keep[first:])):
        if part:
            rounds[i].append(f"{name}\t{';'.join(part)}")
for err in plugin_errors():
    print(f"plugin not loaded: {err.ref} ({err.source}): {err.error}", file=sys.stderr)
print("\n".join(rounds[0] + rounds[1]))
PY
)
[ -n "$PLAN" ] || { echo "nothing to record"; exit 1; }

count() { awk -F';' '{print NF}' <<<"$1"; }
after=0
while IFS=$'\t' read -r _ shapes; do after=$((after + $(count "$shapes"))); done <<<"$PLAN"
DEADLINE=$((START + TOTAL))
status=0
while IFS=$'\t' read -r kernel shapes; do
  n=$(count "$shapes")
  after=$((after - n))
  left=$((DEADLINE - $(date +%s) - RESERVE * after))
  echo "== $(date -u +%T) $kernel: $n tables in <= $left s ($after tables after): $shapes"
  if [ "$left" -lt 10 ]; then echo "skip $kernel $shapes: no time left"; status=1; continue; fi
  "$PY" -m bench.record_tables --kernel "$kernel" --shapes "$shapes" --out-dir "$OUT" \
    --backend "$BACKEND" --limit-seconds "$CAP" --total-seconds "$left" \
    --reserve-seconds "$RESERVE" --compile-timeout "${COMPILE_TIMEOUT:-15}" || status=1
done <<<"$PLAN"

echo "== $(date -u +%T) done in $(( $(date +%s) - START )) s; tables in $OUT:"
"$PY" - "$OUT" <<'PY'
import json
import sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*.json")):
    t = json.loads(path.read_text())
    cov = t.get("coverage", {})
    ok = [r["ms"] for r in t["results"] if "ms" in r]
    print(f"{path.name}: {cov.get('measured')}/{cov.get('space')} configs "
          f"({'the whole space' if cov.get('complete') else 'INCOMPLETE: ' + str(cov.get('stopped'))}"
          f", {cov.get('wall_s')} s), "
          f"{len(ok)} ok, best {min(ok):.4f} ms, torch {t.get('reference_ms') or '-'}")
PY
exit $status
