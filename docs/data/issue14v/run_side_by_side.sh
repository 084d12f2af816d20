#!/usr/bin/env bash
# Issue 14, twenty-second window (a Zen 3): gpt-oss bench bf16 at 16K and 32K side by side, as
# the twentieth window's run_cp_32k.sh ran 32K: SLOPE (1 rank x 2 threads), llama.cpp's
# llama-bench with flash attention off (its faster setting at 16K here, nineteenth window; no
# warm-up run), SLOPE again; a peak probe after each step. Usage: run_side_by_side.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
g=models/bench-gpt-oss-bf16
for n in 16384 32768; do
  slope "$g" "$n" "gpt-oss-$n-1"
  peer "$g" "$n" 0 "gpt-oss-$n-fa0" -- --no-warmup
  slope "$g" "$n" "gpt-oss-$n-2"
done
probe end
