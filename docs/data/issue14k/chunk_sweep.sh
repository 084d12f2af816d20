#!/usr/bin/env bash
# gpt-oss bench 4K prefills with --chunk (tokens per chunk of the token-local work, so also per MoE
# call) 1024 (the default), 2048 and 4096, alternated ROUNDS times, then a peak probe.
# Usage: chunk_sweep.sh ROUNDS > chunk_sweep.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
for r in $(seq "$1"); do
  for c in 1024 2048 4096; do
    build/release/slope run --model models/bench-gpt-oss-bf16 --random-tokens 4096 --seed 1 --threads 2 --json --chunk "$c" 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], "chunk", sys.argv[2], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_GB", round(j["peak_memory_bytes"] / 1e9, 2))' "$r" "$c"
  done
done
echo "probe $(scripts/peak_probe.sh)"
