#!/usr/bin/env bash
# The MoE's expert GEMM shapes (bench_gemm, bf16, gpt-oss bench H = I = 1024) on one thread, then the
# same on each core at once (two processes, taskset), then on two threads, each between peak probes.
# Usage: gemm_moe_shapes.sh > gemm_moe_shapes.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
f='BM_Linear/M:(128|64|32|16)/N:(2048|1024|512)/K:1024/bf16:1'
run() { OMP_NUM_THREADS="$1" taskset -c "$2" build/release/bench/bench_gemm --benchmark_filter="$f" \
  --benchmark_min_time=0.5 2>/dev/null | grep -oE '^BM_Linear/M:[0-9]+/N:[0-9]+|GFLOP/s=[0-9.k]+' | paste -d' ' - -; }
echo "probe $(scripts/peak_probe.sh)"
echo "one thread, alone"; run 1 0
echo "one thread on each core at once (core 1, then core 0)"; run 1 0 > /tmp/gemm_core0.txt & run 1 1; wait; cat /tmp/gemm_core0.txt
echo "two threads"; run 2 0,1
echo "experts in turn, one thread"
OMP_NUM_THREADS=1 taskset -c 0 build/release/bench/bench_gemm --benchmark_filter=BM_LinearExperts \
  --benchmark_min_time=0.5 2>/dev/null | grep -oE '^BM_LinearExperts/[^ ]*|GFLOP/s=[0-9.k]+' | paste -d' ' - -
echo "probe $(scripts/peak_probe.sh)"
