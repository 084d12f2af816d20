#!/usr/bin/env bash
# gpt-oss bench bf16 at 4K: SLOPE (1 rank x 2 threads) and llama.cpp's llama-bench with fa on (its
# better setting at 4K in run_peer.sh) alternated ROUNDS times, probes around every step
# (../issue14i/helpers.sh). Usage: run_peer4k.sh OUT_DIR ROUNDS
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
for r in $(seq "$2"); do
  slope models/bench-gpt-oss-bf16 4096 "gpt-oss-4096-r$r"
  peer models/bench-gpt-oss-bf16 4096 1 "gpt-oss-4096-fa1-r$r"
done
probe end
