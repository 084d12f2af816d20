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
    before=$(THREADS=$threads scripts/peak_probe.sh)
    result=$("$slope" run --model "$model" --random-tokens "$n" --seed 1 --dtype "$dt" --threads "$threads" --json)
    after=$(THREADS=$threads scripts/peak_probe.sh)
    python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['model']='$model'; j['peak_probe']=[json.loads(sys.argv[2]), json.loads(sys.argv[3])]; print(json.dumps(j))" \
      "$result" "$before" "$after" | tee -a "$out"
  done
done
python3 scripts/bench_table.py "$out"
