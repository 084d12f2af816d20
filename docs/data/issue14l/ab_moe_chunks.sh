#!/usr/bin/env bash
# Issue 14, twelfth window: two builds' gpt-oss bench prefills (bf16, 1 rank x 2 threads) alternated,
# ROUNDS times, at 4K and 16K, each with the peak probes around it (../issue14i/helpers.sh). A and B
# are folders holding each build's `slope`. Usage: ab_moe_chunks.sh OUT_DIR ROUNDS A B
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1" rounds="$2" a="$3" b="$4"
source docs/data/issue14i/helpers.sh
begin
for r in $(seq "$rounds"); do
  for bin in "$a" "$b"; do
    for n in 4096 16384; do
      SLOPE_BIN="$bin/slope" slope models/bench-gpt-oss-bf16 "$n" "gpt-oss-$n-$r-$(basename "$bin")"
    done
  done
done
probe end
