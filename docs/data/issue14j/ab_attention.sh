#!/usr/bin/env bash
# Two builds of bench_attention alternated, ROUNDS times, each over the bf16 (AMX) shapes at 4K and
# 16K; a peak probe before and after. Usage: [FILTER=REGEX] ab_attention.sh ROUNDS BIN_A BIN_B > OUT.txt
# (BIN_x: build/release/bench/bench_attention copied out of a build of each commit; FILTER: other
# benchmarks, whose lines then name their benchmark before the shape unless it is BM_SelfAttentionBf16).
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1"; shift
filter="${FILTER:-BM_SelfAttentionBf16/tokens:(4096|16384)/}"
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for bin in "$@"; do
    OMP_NUM_THREADS=2 "$bin" --benchmark_filter="$filter" \
      --benchmark_min_time=0.4 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    n = b["name"].split("/")
    shape = "/".join(n[1:6])
    if n[0] != "BM_SelfAttentionBf16": shape = n[0] + " " + shape
    print(sys.argv[1], sys.argv[2], shape, "GFLOP/s", round(b["GFLOP/s"], 1))' "$r" "$(basename "$bin")"
  done
done
echo "probe $(scripts/peak_probe.sh)"
