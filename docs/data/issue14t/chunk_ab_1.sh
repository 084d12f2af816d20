#!/usr/bin/env bash
# Issue 14, twentieth window: llama bench at 4K with --chunk 1024, 4096 and 2048, two alternated rounds.
# Usage: bash chunk_ab_1.sh > chunk_ab_llama_1.txt
cd "$(dirname "$0")/../../.."
echo "probe $(scripts/peak_probe.sh)"
for r in 1 2; do
  for c in 1024 4096 2048; do
    build/release/slope run --model models/bench-llama-bf16 --random-tokens 4096 --seed 1 --threads 2 --chunk $c --json 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], "chunk", sys.argv[2], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"])' "$r" "$c"
  done
  echo "probe $(scripts/peak_probe.sh)"
done
