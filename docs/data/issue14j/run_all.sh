#!/usr/bin/env bash
# Issue 14, tenth window (an Intel Xeon with AMX): SLOPE (bf16, --bf16-units auto, which keeps the bf16
# units where AMX is usable) and llama.cpp alternated on the same models in one sequential run, each
# step between peak probes (timeline.txt). The steps are ../issue14i/helpers.sh. Needs the release
# build, models/bench-{gpt-oss,llama}-bf16, the KV venv and llama.cpp from scripts/bench_peer.sh
# --build-only. Usage: docs/data/issue14j/run_all.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source "docs/data/issue14i/helpers.sh"
begin
g=models/bench-gpt-oss-bf16 l=models/bench-llama-bf16
slope $g 4096 gpt-oss-4k-a
peer $g 4096 0,1 gpt-oss-4k
slope $g 4096 gpt-oss-4k-b
slope $g 16384 gpt-oss-16k-a
peer $g 16384 0,1 gpt-oss-16k -- --no-warmup
slope $g 16384 gpt-oss-16k-b
slope $g 32768 gpt-oss-32k-a
peer $g 32768 1 gpt-oss-32k -- --no-warmup
slope $g 32768 gpt-oss-32k-b
slope $l 4096 llama-4k-a
peer $l 4096 0,1 llama-4k
slope $l 4096 llama-4k-b
slope $l 16384 llama-16k-a
peer $l 16384 0,1 llama-16k -- --no-warmup
slope $l 16384 llama-16k-b
probe end
