#!/usr/bin/env bash
# The issue's kernel shapes on one machine, SLOPE and PyTorch's CPU SDPA side by side, 2 threads,
# ROUNDS rounds between peak probes: bench_attention's f32 and bf16-mode kernels, causal at
# 4K / 16K / 32K (4 query heads over 1, D 64) and window 128 at the same lengths (16 over 4), then
# SDPA (torch from the KV venv) on the causal shapes (4 over 1) and on the window shapes (16 over 4,
# causal too; its window needs a boolean mask, which takes it off its flash kernel, up to 16K).
# Usage: run_kernels.sh ROUNDS > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
py="${SLOPE_REF_VENV:-/root/.cache/slope/venv-kv}/bin/python"
for r in $(seq "${1:-2}"); do
  echo "round $r probe $(scripts/peak_probe.sh)"
  OMP_NUM_THREADS=2 build/release/bench/bench_attention \
    --benchmark_filter='BM_SelfAttention(Bf16)?/tokens:[0-9]+/Hq:(4/Hkv:1/D:64/window:0|16/Hkv:4/D:64/window:128)' \
    2>/dev/null | grep '^BM_'
  echo "probe $(scripts/peak_probe.sh)"
  "$py" scripts/bench_sdpa_cpu.py --threads 2 --lengths 4096,16384,32768 --heads 4 --kv-heads 1 --window 0 --reps 2
  "$py" scripts/bench_sdpa_cpu.py --threads 2 --lengths 4096,16384 --heads 16 --kv-heads 4 --window 128 --reps 2
done
echo "end probe $(scripts/peak_probe.sh)"
