#!/usr/bin/env bash
# Issue 14, fourteenth window: gpt-oss bench bf16 prefills at 4K / 16K / 32K (1 rank x 2 threads,
# the default --moe-chunk 4096) around llama.cpp's llama-bench (fa on, its best on this machine in
# the earlier windows) at 4K and 16K on the same model, with the peak probes
# (../issue14i/helpers.sh). Usage: run_peer.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
for n in 4096 16384 32768; do slope models/bench-gpt-oss-bf16 "$n" "gpt-oss-$n-1"; done
peer models/bench-gpt-oss-bf16 4096 1 gpt-oss-4096-fa1
peer models/bench-gpt-oss-bf16 16384 1 gpt-oss-16384-fa1 -- --no-warmup
for n in 4096 16384 32768; do slope models/bench-gpt-oss-bf16 "$n" "gpt-oss-$n-2"; done
probe end
