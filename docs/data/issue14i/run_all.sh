#!/usr/bin/env bash
# Issue 14, ninth window: SLOPE (bf16, --bf16-units auto) and llama.cpp alternated on the same
# models in one sequential run, each step between peak probes (timeline.txt), so that each ratio
# has SLOPE runs on both sides of its llama.cpp run. Needs the release build, models/bench-{gpt-oss,
# llama}-bf16, the KV venv (the GGUF converter's Python) and llama.cpp from scripts/bench_peer.sh
# --build-only. Usage: docs/data/issue14i/run_all.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source "docs/data/issue14i/helpers.sh"
begin
g=models/bench-gpt-oss-bf16 l=models/bench-llama-bf16
slope $g 4096 gpt-oss-4k-a
peer $g 4096 0,1 gpt-oss-4k
slope $g 4096 gpt-oss-4k-b
peer $g 4096 1 gpt-oss-4k-fa1-again
slope $g 4096 gpt-oss-4k-c
slope $g 16384 gpt-oss-16k-a
peer $g 16384 1 gpt-oss-16k -- --no-warmup
slope $g 16384 gpt-oss-16k-b
slope $l 4096 llama-4k-a
peer $l 4096 0,1 llama-4k
slope $l 4096 llama-4k-b
build/release/slope run --model $g --random-tokens 16384 --dry-run > "$out/dry-run-16k.txt"
probe end
