#!/usr/bin/env bash
# Issue 14, ninth window, second part: llama bench at 16K, SLOPE on both sides of llama.cpp with
# flash attention off (its faster setting at 16K on the Zen 4 of the first window: 46 against 34
# tok/s; one setting, as each takes about ten minutes here). Same helpers (helpers.sh) and output
# files as run_all.sh. Usage: docs/data/issue14i/run_llama16k.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"; mkdir -p "$out"
source "docs/data/issue14i/helpers.sh"
git rev-parse HEAD > "$out/commit-llama16k.txt"
probe start-llama16k
l=models/bench-llama-bf16
slope $l 16384 llama-16k-a
peer $l 16384 0 llama-16k -- --no-warmup
slope $l 16384 llama-16k-b
