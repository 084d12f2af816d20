#!/usr/bin/env bash
# Issue 14, twentieth window: llama and gpt-oss bench at 4K with --chunk 2048 and 1024 (the other order), two alternated rounds.
# Usage: bash chunk_ab_2.sh > chunk_ab_2.txt
cd "$(dirname "$0")/../../.."
echo "probe $(scripts/peak_probe.sh)"
for r in 1 2; do
  for m in llama gpt-oss; do
  for c in 2048 1024; do
    build/release/slope run --model models/bench-$m-bf16 --random-tokens 4096 --seed 1 --threads 2 --chunk $c --json 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], sys.argv[3], "chunk", sys.argv[2], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_mem", j["peak_memory_bytes"])' "$r" "$c" "$m"
  done
  done
  echo "probe $(scripts/peak_probe.sh)"
done
