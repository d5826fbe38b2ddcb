#!/usr/bin/env bash
# Issue 27 on the GPU: the corpus of real library kernels (tests/corpus/: fla-core and
# liger-kernel, installed, never copied) registered through TUNER_KERNELS, tuned through
# `tuner serve` over HTTP, then served and timed against each library's own autotune pick
# by bench/corpus_demo.py. Usage: bench/corpus_demo.sh OUT_DIR
set -uo pipefail
out=${1:?usage: bench/corpus_demo.sh OUT_DIR}
mkdir -p "$out"
PY=${PY:-python3}
. scripts/carried_wheels.sh
need_packages 'import optuna, sqlalchemy, fastapi, uvicorn, fla, liger_kernel'
port=8767
url=http://127.0.0.1:$port
db=/tmp/corpus-demo.db
rm -f $db*
exec > >(tee "$out/corpus_demo_transcript.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
TUNER_KERNELS=$($PY -m bench.corpus_demo refs)
export TUNER_KERNELS
echo "TUNER_KERNELS=$TUNER_KERNELS"
echo "\$ tuner --db sqlite:///$db serve --port $port --backend cuda &"
$PY -m tuner.cli --db "sqlite:///$db" serve --port $port --backend cuda > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 240); do
  curl -sf $url/api/v1/devices | grep -q '"cuda' && break; sleep 0.5
done
curl -s $url/api/v1/kernels | $PY -c 'import json,sys; d=json.load(sys.stdin); print([k["name"] for k in d["data"]], d.get("errors"))'
$PY -m bench.corpus_demo tune --url $url --out "$out/tune.json"
for arm in tuner library; do  # each in a fresh process, on a fresh Triton cache
  TRITON_CACHE_DIR=$(mktemp -d) $PY -m bench.corpus_demo first-launch --arm $arm --url $url \
    --out "$out/first_$arm.json"
done
$PY -m bench.corpus_demo kernel-times --url $url --out "$out/kernel_times.json"
{ echo "Produced by \`bash bench/corpus_demo.sh OUT_DIR\` on: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader);"
  echo "triton $($PY -c 'import triton; print(triton.__version__)'), torch $($PY -c 'import torch; print(torch.__version__)')"
  echo; $PY -m bench.corpus_demo report --dir "$out"; } > "$out/corpus_demo.md"
cat "$out/corpus_demo.md"
kill $pid; wait $pid 2>/dev/null
echo "--- server log (tail) ---"; tail -5 "$out/serve.log"
