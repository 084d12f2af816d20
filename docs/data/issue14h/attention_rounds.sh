#!/usr/bin/env bash
# bf16 mode's attention at 16K causal, 4 q / 1 KV heads, D 64, 2 threads, against PyTorch's CPU
# SDPA, ROUNDS times alternated, each between peak probes: SLOPE's f32 kernel (what bf16 mode
# runs on the f32 units) and its bf16 kernel (the bf16 units), then SDPA in f32 and bf16.
# Usage: attention_rounds.sh ROUNDS > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
for r in $(seq "${1:-2}"); do
  echo "round $r probe $(scripts/peak_probe.sh)"
  OMP_NUM_THREADS=2 build/release/bench/bench_attention \
    --benchmark_filter='BM_SelfAttention(Bf16)?/tokens:16384/Hq:4/Hkv:1/D:64/window:0' \
    --benchmark_min_time=4 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    print(b["name"].split("/")[0], "iterations", b["iterations"], "GFLOP/s", round(b["GFLOP/s"], 1), b.get("label", ""))'
  /root/.cache/slope/venv-kv/bin/python scripts/bench_sdpa_cpu.py --threads 2 --lengths 16384 --heads 4 --kv-heads 1 \
    --window 0 --reps 3
done
echo "end probe $(scripts/peak_probe.sh)"
