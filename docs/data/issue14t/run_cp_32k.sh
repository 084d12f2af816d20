#!/usr/bin/env bash
# Issue 14, twentieth window (a Zen 3): context parallelism with the twelfth window's script
# (../issue14l/run_cp.sh: bench_cp_overlap at 16K and 32K, CMA on and off, progress thread off and
# on; gpt-oss bench prefills 1x1 / r2 / u2 at 16K and 32K), then gpt-oss bench at 32K side by side:
# SLOPE (1 rank x 2 threads), llama.cpp's llama-bench with flash attention off (its faster setting
# at 16K here, nineteenth window; no warm-up run), SLOPE again. Usage: run_cp_32k.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
bash docs/data/issue14l/run_cp.sh "$out"
source docs/data/issue14i/helpers.sh
g=models/bench-gpt-oss-bf16
slope "$g" 32768 gpt-oss-32768-1
peer "$g" 32768 0 gpt-oss-32768-fa0 -- --no-warmup
slope "$g" 32768 gpt-oss-32768-2
probe end
