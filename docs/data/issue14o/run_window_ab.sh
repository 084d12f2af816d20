#!/usr/bin/env bash
# Alternated rounds of bench_attention_window (window 128 against causal, whole calls and the
# engine's 1024-row chunk calls, f32 and bf16) for two builds, with the peak probe around each
# round. Usage: run_window_ab.sh ROUNDS BASE_BUILD NEW_BUILD  (each a build/release directory)
set -euo pipefail
rounds="$1" base="$2" new="$3"
cd "$(dirname "$0")/../../.."
for r in $(seq "$rounds"); do
  for b in base new; do
    dir="$base"; [ "$b" = new ] && dir="$new"
    echo "== round $r, $b ($dir), $(date -u +%H:%M:%S), probe $(scripts/peak_probe.sh)"
    OMP_NUM_THREADS=2 "$dir/bench/bench_attention_window" 3 2>&1
  done
done
echo "== end $(date -u +%H:%M:%S), probe $(scripts/peak_probe.sh)"
