#!/usr/bin/env bash
# gpt-oss bench prefills again at the tenth window's last commit (after the MoE row chunks), with
# their probes, into OUT_DIR/slope-final.jsonl and OUT_DIR/timeline-final.txt (../issue14i/helpers.sh).
# Usage: docs/data/issue14j/run_final.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"; mkdir -p "$out"
final="$out/final"; mkdir -p "$final"
source "docs/data/issue14i/helpers.sh"
out="$final"
git rev-parse HEAD > "$out/commit.txt"
g=models/bench-gpt-oss-bf16
for n in 4096 16384 32768; do slope $g $n gpt-oss-$n-final; done
