#!/usr/bin/env bash
# Issue 10 on the H200: the two example kernels (examples/) registered as plugins (rmsnorm
# installed as a package with a tuner.kernels entry point, bias_gelu through TUNER_KERNELS),
# tuned through `tuner serve` over HTTP, then launched through tuner.autotune by
# bench/plugin_demo.py. Usage: bench/plugin_demo.sh OUT_DIR
set -uo pipefail
out=${1:?usage: bench/plugin_demo.sh OUT_DIR}
mkdir -p "$out"
port=8766
site=/tmp/plugin-site
python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir --target "$site" examples/rmsnorm
export PYTHONPATH="$site:$PWD/examples/bias_gelu:${PYTHONPATH:-}"
export TUNER_KERNELS=bias_gelu:KERNEL
db=/tmp/plugin-demo.db
rm -f $db*
exec > >(tee "$out/plugin_demo_transcript.txt") 2>&1
echo "\$ tuner --db sqlite:///$db serve --port $port --backend cuda &"
python3 -m tuner.app.cli --db "sqlite:///$db" serve --port $port --backend cuda > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 240); do
  curl -sf localhost:$port/api/v1/devices | grep -q '"cuda' && break; sleep 0.5
done
echo "\$ curl -s localhost:$port/api/v1/kernels | (names and plugin errors)"
curl -s localhost:$port/api/v1/kernels | python3 -c 'import json,sys; d=json.load(sys.stdin); print([k["name"] for k in d["data"]], d.get("errors"))'
submit() {
  curl -s -X POST localhost:$port/api/v1/jobs -H 'content-type: application/json' -d "$1" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'
}
rms='{"kernel": "rmsnorm", "dtype": "float16", "shapes": [{"M": 4096, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 2048, "N": 14336}, {"M": 64, "N": 8192}], "budget": {"trials": 48}}'
gelu='{"kernel": "bias_gelu", "dtype": "float16", "shapes": [{"M": 4096, "N": 4096}, {"M": 16384, "N": 11008}, {"M": 256, "N": 14336}], "budget": {"trials": 48}}'
echo "\$ curl -X POST /api/v1/jobs $rms"; j1=$(submit "$rms"); echo "job $j1"
echo "\$ curl -X POST /api/v1/jobs $gelu"; j2=$(submit "$gelu"); echo "job $j2"
t0=$(date +%s)
for id in $j1 $j2; do
  while true; do
    status=$(curl -s localhost:$port/api/v1/jobs/$id | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["kernel"], j["status"], [(t["trials_done"], t["best_ms"]) for t in j["tasks"]])')
    echo "[$(( $(date +%s) - t0 )) s] $status"
    case "$status" in *succeeded*|*failed*|*cancelled*) break;; esac
    sleep 5
  done
done
url=http://127.0.0.1:$port
for arm in tuner triton; do
  cache=$(mktemp -d)
  TRITON_CACHE_DIR=$cache python3 -m bench.plugin_demo first-launch --arm $arm --url $url --out "$out/first_${arm}_cold.json"
  TRITON_CACHE_DIR=$cache python3 -m bench.plugin_demo first-launch --arm $arm --url $url --out "$out/first_${arm}_warm.json"
done
python3 -m bench.plugin_demo kernel-times --url $url --out "$out/kernel_times.json"
{ echo "Produced by \`bash bench/plugin_demo.sh OUT_DIR\` on: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo; python3 -m bench.plugin_demo report --dir "$out"; } > "$out/plugin_demo.md"
cat "$out/plugin_demo.md"
kill $pid; wait $pid 2>/dev/null
echo "--- server log (tail) ---"; tail -5 "$out/serve.log"
