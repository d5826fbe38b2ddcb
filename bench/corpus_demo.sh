#!/usr/bin/env bash
# Issue 27 on the GPU: the corpus of real library kernels (tests/corpus/: fla-core and
# liger-kernel, installed, never copied) registered through TUNER_KERNELS, tuned through
# `tuner serve` over HTTP, then served and timed against each library's own autotune pick by
# bench/corpus_demo.py. Two phases, each inside one device call:
#
#   bench/corpus_demo.sh OUT_DIR tune [DB]  # tuner serve tunes the corpus into OUT_DIR/corpus.db
#                                           # (starting from a copy of DB, to add kernels to it)
#   bench/corpus_demo.sh OUT_DIR measure DB # first launches and kernel times, served from DB
#
# CORPUS_ONLY / CORPUS_SKIP (comma-separated kernel names) split the corpus across calls.
set -uo pipefail
out=${1:?usage: bench/corpus_demo.sh OUT_DIR tune|measure [DB]}
phase=${2:?usage: bench/corpus_demo.sh OUT_DIR tune|measure [DB]}
mkdir -p "$out"
PY=${PY:-python3}
. scripts/carried_wheels.sh
need_packages 'import optuna, sqlalchemy, fastapi, uvicorn, fla, liger_kernel'
port=8767
url=http://127.0.0.1:$port
exec > >(tee "$out/corpus_demo_$phase.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
TUNER_KERNELS=$($PY -m bench.corpus_demo refs 2>/dev/null)
export TUNER_KERNELS
echo "TUNER_KERNELS=$TUNER_KERNELS"
if [ "$phase" = tune ]; then
  db=$out/corpus.db
  rm -f "$db"*
  if [ -n "${3:-}" ]; then cp "$3" "$db"; fi
else
  db=${3:?measure needs the DB the tune phase wrote}
fi
echo "\$ tuner --db sqlite:///$db serve --port $port --backend cuda &"
$PY -m tuner.app.cli --db "sqlite:///$db" serve --port $port --backend cuda > "$out/serve_$phase.log" 2>&1 &
pid=$!
for _ in $(seq 240); do
  curl -sf $url/api/v1/devices | grep -q '"cuda' && break; sleep 0.5
done
curl -s $url/api/v1/kernels | $PY -c 'import json,sys; d=json.load(sys.stdin); print([k["name"] for k in d["data"]], d.get("errors"))'
if [ "$phase" = tune ]; then
  $PY -m bench.corpus_demo tune --url $url --out "$out/tune.json"
else
  for arm in tuner library; do  # each in a fresh process, on a fresh Triton cache
    TRITON_CACHE_DIR=$(mktemp -d) $PY -m bench.corpus_demo first-launch --arm $arm --url $url \
      --out "$out/first_$arm.json"
  done
  $PY -m bench.corpus_demo kernel-times --url $url --out "$out/kernel_times.json" \
    --picks "$out/first_library.json"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
fi
kill $pid; wait $pid 2>/dev/null
echo "--- server log (tail) ---"; tail -5 "$out/serve_$phase.log"
