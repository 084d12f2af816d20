#!/usr/bin/env bash
# Issue 14, sixteenth window (Zen 4): gpt-oss bench bf16 prefills at 4K / 16K / 32K and llama bench
# at 4K (1 rank x 2 threads, the defaults), around llama.cpp's llama-bench on the same models:
# gpt-oss at 4K with fa off and on and at 16K with fa off (its better setting at 16K on this kind of
# machine, sixth window), llama at 4K with fa off and on; then the gpt-oss prefills at 4K and 16K
# again. Peak probes around every step (../issue14i/helpers.sh). Usage: run_peer.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
bench_models
begin
for n in 4096 16384 32768; do slope "$g" "$n" "gpt-oss-$n-1"; done
peer "$g" 4096 0,1 gpt-oss-4096
peer "$g" 16384 0 gpt-oss-16384-fa0 -- --no-warmup
slope "$l" 4096 llama-4096-1
peer "$l" 4096 0,1 llama-4096
for n in 4096 16384; do slope "$g" "$n" "gpt-oss-$n-2"; done
slope "$l" 4096 llama-4096-2
probe end
