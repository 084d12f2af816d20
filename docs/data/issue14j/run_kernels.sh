#!/usr/bin/env bash
# Issue 14 attention kernels, tenth window: SLOPE's f32 kernel, its bf16 kernel (AMX tiles here) and
# the bf16 kernel on vdpbf16ps alone, at 4K, 16K and 32K (causal 4 q / 1 KV heads, window 128 16 / 4,
# head_dim 64), then PyTorch's CPU SDPA on the causal shapes, ROUNDS times, each step between peak
# probes. Usage: run_kernels.sh ROUNDS > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
py="${SLOPE_REF_VENV:-/root/.cache/slope/venv-kv}/bin/python"
for r in $(seq "${1:-1}"); do
  echo "round $r probe $(scripts/peak_probe.sh)"
  OMP_NUM_THREADS=2 build/release/bench/bench_attention \
    --benchmark_filter='BM_SelfAttention(Bf16|Bf16Dot)?/tokens:(4096|16384|32768)/' \
    --benchmark_min_time=0.5 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    n = b["name"].split("/")
    print(n[0], "/".join(n[1:6]), "iterations", b["iterations"], "GFLOP/s", round(b["GFLOP/s"], 1), b.get("label", ""))'
  echo "round $r probe $(scripts/peak_probe.sh)"
  "$py" scripts/bench_sdpa_cpu.py --threads 2 --lengths 4096,16384,32768 --heads 4 --kv-heads 1 --window 0 --reps 3
done
echo "end probe $(scripts/peak_probe.sh)"
