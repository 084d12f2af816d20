#!/usr/bin/env bash
# bench_attention's bf16 causal cases (4 / 1 heads, head_dim 64, 4K / 16K / 32K) of two builds,
# alternated ROUNDS times, with the peak probe before each run.
# Usage: run_causal_ab.sh ROUNDS OLD_BUILD NEW_BUILD  (each a build/release directory)
set -euo pipefail
rounds="$1" old="$2" new="$3"
cd "$(dirname "$0")/../../.."
for r in $(seq "$rounds"); do
  for b in old new; do
    dir="$old"; [ "$b" = new ] && dir="$new"
    echo "== round $r, $b ($dir), $(date -u +%H:%M:%S), probe $(scripts/peak_probe.sh)"
    OMP_NUM_THREADS=2 "$dir/bench/bench_attention" \
      --benchmark_filter='BM_SelfAttentionBf16/tokens:(4096|16384|32768)/Hq:4/' \
      --benchmark_min_time=0.5 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    print(b["name"], "GFLOP/s", round(b["GFLOP/s"], 1))'
  done
done
echo "== end $(date -u +%H:%M:%S), probe $(scripts/peak_probe.sh)"
