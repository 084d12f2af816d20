#!/usr/bin/env bash
# Issue 14, twelfth window: bench_attention builds alternated, ROUNDS times, over the window-128 shapes
# (16 / 4 heads, head_dim 64) at 4K, 16K and 32K, f32 and bf16; a peak probe before and after.
# Usage: ab_window.sh ROUNDS BIN... > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1"; shift
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for bin in "$@"; do
    OMP_NUM_THREADS=2 "$bin" --benchmark_filter='BM_SelfAttention(Bf16)?/tokens:(4096|16384|32768)/Hq:16/Hkv:4/D:64/window:128' \
      --benchmark_min_time=0.4 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    n = b["name"].split("/")
    print(sys.argv[1], sys.argv[2], n[0], "/".join(n[1:6]), "GFLOP/s", round(b["GFLOP/s"], 1))' "$r" "$(basename "$bin")"
  done
done
echo "probe $(scripts/peak_probe.sh)"
