#!/usr/bin/env bash
# Issue 14, twenty-third window (a Zen 4): the llama bench model, bf16, at 16K side by side:
# SLOPE (1 rank x 2 threads), llama.cpp's llama-bench with flash attention off (its faster 16K
# setting on this kind of machine: 46 against 34 tok/s in the first window; no warm-up run),
# SLOPE again; a peak probe after each step. Usage: run_llama_16k.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
bench_models
slope "$l" 16384 "llama-16384-1"
peer "$l" 16384 0 "llama-16384-fa0" -- --no-warmup
slope "$l" 16384 "llama-16384-2"
probe end
