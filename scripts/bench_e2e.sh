#!/usr/bin/env bash
# End-to-end prefill benchmark on one rank: the `bench` model(s) at several prompt lengths in
# f32 and bf16, 2 threads. Prints one JSON line per run (slope run --json) into OUT (default
# bench-results/e2e.jsonl) and a table. Usage: scripts/bench_e2e.sh [LENGTHS] [DTYPES] [ARCH]
set -euo pipefail
cd "$(dirname "$0")/.."
lengths="${1:-1024 4096 16384 32768}"
dtypes="${2:-f32 bf16}"
arch="${3:-gpt-oss}"
threads="${THREADS:-2}"
out="${OUT:-bench-results/e2e.jsonl}"
slope=build/release/slope
mkdir -p "$(dirname "$out")"
for dt in $dtypes; do
  model="models/bench-$arch-$dt"
  [ -f "$model/model.safetensors" ] || "$slope" make-model --arch "$arch" --preset bench --seed 1 --dtype "$dt" --out "$model"
  for n in $lengths; do
    "$slope" run --model "$model" --random-tokens "$n" --seed 1 --dtype "$dt" --threads "$threads" --json \
      | python3 -c "import json,sys; j=json.load(sys.stdin); j['model']='$model'; print(json.dumps(j))" | tee -a "$out"
  done
done
python3 scripts/bench_table.py "$out"
