#!/usr/bin/env bash
# Issue 14, twenty-third window (a Zen 4): gpt-oss bench bf16 at 4K side by side, alternated:
# SLOPE (1 rank x 2 threads), llama.cpp's llama-bench with flash attention on (its faster 4K
# setting on this kind of machine, sixteenth and eighteenth windows), then off, SLOPE, llama.cpp
# fa on again, SLOPE; then 16K once: SLOPE, llama.cpp fa off (its faster 16K setting), SLOPE.
# A peak probe after each step. Usage: run_side_by_side.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
g=models/bench-gpt-oss-bf16
slope "$g" 4096 "gpt-oss-4096-1"
peer "$g" 4096 1 "gpt-oss-4096-fa1-1"
peer "$g" 4096 0 "gpt-oss-4096-fa0"
slope "$g" 4096 "gpt-oss-4096-2"
peer "$g" 4096 1 "gpt-oss-4096-fa1-2"
slope "$g" 4096 "gpt-oss-4096-3"
slope "$g" 16384 "gpt-oss-16384-1"
peer "$g" 16384 0 "gpt-oss-16384-fa0" -- --no-warmup
slope "$g" 16384 "gpt-oss-16384-2"
probe end
