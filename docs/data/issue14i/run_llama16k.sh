#!/usr/bin/env bash
# Issue 14, ninth window, second part: llama bench at 16K, SLOPE on both sides of llama.cpp with
# flash attention off (its faster setting at 16K on the Zen 4 of the first window: 46 against 34
# tok/s; one setting, as each takes about ten minutes here). Same helpers and output files as
# run_all.sh. Usage: docs/data/issue14i/run_llama16k.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"; mkdir -p "$out"
export SLOPE_REF_VENV="${SLOPE_REF_VENV:-/root/.cache/slope/venv-kv}"
probe() { echo "$(date -u +%H:%M:%S) $1 $(scripts/peak_probe.sh)" | tee -a "$out/timeline.txt"; }
slope() {
  local before after result
  before=$(scripts/peak_probe.sh)
  result=$(build/release/slope run --model "$1" --random-tokens "$2" --seed 1 --threads 2 --json)
  after=$(scripts/peak_probe.sh)
  python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['label']=sys.argv[4]; j['peak_probe']=[json.loads(sys.argv[2]), json.loads(sys.argv[3])]; print(json.dumps(j))" \
    "$result" "$before" "$after" "$3" >> "$out/slope.jsonl"
  probe "slope-$3"
}
git rev-parse HEAD > "$out/commit-llama16k.txt"
probe start-llama16k
l=models/bench-llama-bf16
slope $l 16384 llama-16k-a
scripts/bench_peer.sh -o jsonl -r 1 --model $l -p 16384 --fa 0 -- --no-warmup | grep '^{' |
  python3 -c "import json,sys; [print(json.dumps(dict(json.loads(l), label='llama-16k'))) for l in sys.stdin]" >> "$out/peer.jsonl"
probe peer-llama-16k
slope $l 16384 llama-16k-b
