#!/usr/bin/env bash
# Real data for the dashboard's screenshots (docs/): `tuner serve` on the GPU, two jobs submitted
# over HTTP, the SQLite file copied out. Usage: bench/dashboard_demo_data.sh OUT_DIR
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
port=8766
db=/tmp/dashboard-demo.db
rm -f $db*
python3 -m tuner.app.cli --db "sqlite:///$db" serve --port $port --backend cuda > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf localhost:$port/readyz >/dev/null && break; sleep 0.5; done
submit() { curl -s -X POST localhost:$port/api/v1/jobs -H 'content-type: application/json' -d "$1"; echo; }
submit '{"kernel": "matmul", "dtype": "float16", "budget": {"trials": 48}, "shapes": [{"M": 4096, "N": 4096, "K": 4096}, {"M": 16, "N": 4096, "K": 4096}, {"M": 1000, "N": 3000, "K": 500}, {"M": 8192, "N": 8192, "K": 1024}]}'
submit '{"kernel": "matmul", "dtype": "bfloat16", "budget": {"trials": 48}, "shapes": [{"M": 2048, "N": 2048, "K": 2048}, {"M": 32, "N": 14336, "K": 4096}, {"M": 4096, "N": 14336, "K": 4096}]}'
submit '{"kernel": "flash_attention_causal", "dtype": "bfloat16", "budget": {"trials": 32}, "shapes": [{"B": 4, "H": 32, "S": 4096, "D": 128}]}'
submit '{"kernel": "softmax", "dtype": "float16", "budget": {"trials": 32}, "shapes": [{"M": 16, "N": 131072}, {"M": 4096, "N": 4096}]}'
submit '{"kernel": "conv2d_nhwc", "dtype": "float16", "budget": {"trials": 32}, "shapes": [{"N": 100, "C": 3, "H": 224, "W": 224, "K": 96, "R": 11, "S": 11, "STRIDE": 4, "PAD1": 3, "DIL": 1}]}'
t0=$(date +%s)
while true; do
  left=$(curl -s "localhost:$port/api/v1/jobs?limit=10" | python3 -c 'import json,sys; print(sum(j["status"] in ("queued","running") for j in json.load(sys.stdin)["data"]))')
  echo "[$(( $(date +%s) - t0 )) s] active jobs: $left"
  [ "$left" = "0" ] && break
  [ $(( $(date +%s) - t0 )) -gt "${DEMO_MAX_S:-420}" ] && break
  sleep 10
done
kill $pid; wait $pid 2>/dev/null
python3 - "$db" "$out/dashboard_demo_h200.db" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1])
dst = sqlite3.connect(sys.argv[2])
src.backup(dst)  # one self-contained file (WAL folded in)
print("copied", sys.argv[2])
PY
