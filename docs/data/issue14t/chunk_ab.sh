#!/usr/bin/env bash
# Issue 14, twentieth window: bench prefills at 4K (1 rank x 2 threads) with each --chunk in
# CHUNKS, in that order, for each model in MODELS, ROUNDS times; a peak probe before and after
# each round. Usage: chunk_ab.sh ROUNDS "MODELS" "CHUNKS"  (MODELS: llama, gpt-oss)
#   chunk_ab.sh 2 llama "1024 4096 2048"       > chunk_ab_llama_1.txt
#   chunk_ab.sh 2 "llama gpt-oss" "2048 1024"  > chunk_ab_2.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1" models="$2" chunks="$3"
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for m in $models; do
    for c in $chunks; do
      build/release/slope run --model "models/bench-$m-bf16" --random-tokens 4096 --seed 1 --threads 2 --chunk "$c" --json 2>/dev/null |
        python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], sys.argv[3], "chunk", sys.argv[2], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_mem", j["peak_memory_bytes"])' "$r" "$c" "$m"
    done
  done
  echo "probe $(scripts/peak_probe.sh)"
done
