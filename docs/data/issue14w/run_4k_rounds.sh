#!/usr/bin/env bash
# Issue 14, twenty-third window (a Zen 4): gpt-oss bench bf16 at 4K, SLOPE (1 rank x 2 threads) and
# llama.cpp llama-bench with flash attention on (its faster 4K setting in run_side_by_side.sh)
# alternated three times, SLOPE on both sides of each llama.cpp run; a probe after each step.
# Usage: run_4k_rounds.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
g=models/bench-gpt-oss-bf16
for r in 1 2 3; do
  slope "$g" 4096 "gpt-oss-4096-$r"
  peer "$g" 4096 1 "gpt-oss-4096-fa1-$r"
done
slope "$g" 4096 "gpt-oss-4096-4"
probe end
