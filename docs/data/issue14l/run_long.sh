#!/usr/bin/env bash
# Issue 14, twelfth window: gpt-oss bench bf16 at 64K tokens, 1 rank x 2 threads, twice, with the
# predicted memory (--dry-run) and the peak probes (../issue14i/helpers.sh). Usage: run_long.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
build/release/slope run --model models/bench-gpt-oss-bf16 --random-tokens 65536 --dry-run > "$out/dry-run-64k.txt"
slope models/bench-gpt-oss-bf16 65536 gpt-oss-65536-a
slope models/bench-gpt-oss-bf16 65536 gpt-oss-65536-b
probe end
