#!/usr/bin/env bash
# Issue 14, twentieth window (a Zen 3): llama bench at 16K side by side: SLOPE (1 rank x 2 threads),
# llama.cpp's llama-bench with flash attention off (its faster setting at 16K on the Zen 4 and the
# Intel; no warm-up run), SLOPE again.
# Usage: run_llama16k.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
l=models/bench-llama-bf16
begin
slope "$l" 16384 llama-16384-1
peer "$l" 16384 0 llama-16384-fa0 -- --no-warmup
slope "$l" 16384 llama-16384-2
probe end
