#!/usr/bin/env bash
# Issue 3 on the GPU: `tuner serve`, three matmul shapes submitted over HTTP with curl, fetched
# by the Python client. Usage: bench/serve_demo.sh OUT_FILE
set -uo pipefail
out=${1:-/dev/stdout}
port=8765
db=sqlite:////tmp/serve-demo.db
rm -f /tmp/serve-demo.db*
exec > >(tee "$out") 2>&1
echo "\$ tuner --db $db serve --port $port --backend cuda &"
python3 -m tuner.app.cli --db "$db" serve --port $port --backend cuda > /tmp/serve.log 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf localhost:$port/readyz >/dev/null && break; sleep 0.5; done
echo "\$ curl -s localhost:$port/readyz"; curl -s localhost:$port/readyz; echo
body='{"kernel": "matmul", "dtype": "float16", "shapes": [{"M": 4096, "N": 4096, "K": 4096}, {"M": 16, "N": 4096, "K": 4096}, {"M": 1000, "N": 3000, "K": 500}], "budget": {"trials": 32}}'
echo "\$ curl -s -X POST localhost:$port/api/v1/jobs -H 'content-type: application/json' -d '$body'"
job=$(curl -s -X POST localhost:$port/api/v1/jobs -H 'content-type: application/json' -d "$body")
echo "$job"
id=$(echo "$job" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
t0=$(date +%s)
while true; do
  status=$(curl -s localhost:$port/api/v1/jobs/$id | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["status"], [t["trials_done"] for t in j["tasks"]])')
  echo "[$(( $(date +%s) - t0 )) s] $status"
  case "$status" in succeeded*|failed*|cancelled*) break;; esac
  sleep 5
done
echo "\$ curl -s localhost:$port/api/v1/jobs/$id"; curl -s localhost:$port/api/v1/jobs/$id; echo
echo "\$ curl -s localhost:$port/api/v1/devices"; curl -s localhost:$port/api/v1/devices; echo
echo "\$ python3 - <<client>>"
python3 - <<PY
from tuner.client import TunerClient
c = TunerClient("http://127.0.0.1:$port")
shapes = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 16, "N": 4096, "K": 4096},
          {"M": 1000, "N": 3000, "K": 500}, {"M": 2000, "N": 3000, "K": 500}]
print("prefetch answered", c.prefetch("matmul", shapes, "float16"))
for s in shapes:
    a = c.lookup("matmul", s, "float16")
    print(s, a["match"], a["device"], a["config"], a["ms"])
PY
kill $pid; wait $pid 2>/dev/null
echo "--- server log (tail) ---"; tail -5 /tmp/serve.log
