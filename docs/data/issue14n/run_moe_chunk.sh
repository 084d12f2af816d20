#!/usr/bin/env bash
# Issue 14, fourteenth window: MoE calls of their own size. gpt-oss bench prefills at 4K / 16K /
# 32K, --chunk 1024 (norm, QKV), --moe-chunk 1024 (the calls before: one per chunk), 2048, 4096
# and 8192 (or MOE_CHUNKS), alternated ROUNDS times; a peak probe before and after each round.
# Usage: run_moe_chunk.sh ROUNDS [SIZES [MOE_CHUNKS]] > moe_chunk.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1"
sizes="${2:-4096 16384 32768}"
moe_chunks="${3:-1024 2048 4096 8192}"
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for n in $sizes; do
    for mc in $moe_chunks; do
      build/release/slope run --model models/bench-gpt-oss-bf16 --random-tokens "$n" --seed 1 --threads 2 --json \
        --chunk 1024 --moe-chunk "$mc" 2>/dev/null |
        python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], "tokens", sys.argv[2], "moe_chunk", sys.argv[3], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_GB", round(j["peak_memory_bytes"] / 1e9, 2))' "$r" "$n" "$mc"
    done
  done
  echo "probe $(scripts/peak_probe.sh)"
done
