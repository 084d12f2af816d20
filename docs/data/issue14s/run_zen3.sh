#!/usr/bin/env bash
# Issue 14, nineteenth window (a Zen 3: AVX2 and FMA, no AVX-512, no bf16 arithmetic): the MoE
# bench with both GEMMs of the f32 units (oneDNN's matmul and the AVX2 panel GEMM), then gpt-oss
# bench bf16 prefills at 4K and 16K and llama bench at 4K (1 rank x 2 threads, the defaults) around
# llama.cpp's llama-bench on the same models: gpt-oss at 4K with fa off and on and at 16K with fa
# off, llama at 4K with fa off and on; then the prefills again. Peak probes around every step
# (../issue14i/helpers.sh). Usage: run_zen3.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
bench_models
begin
OMP_NUM_THREADS=2 build/release/bench/bench_moe --benchmark_min_time=1 > "$out/bench_moe.txt" 2>&1
probe bench_moe
for n in 4096 16384; do slope "$g" "$n" "gpt-oss-$n-1"; done
peer "$g" 4096 0,1 gpt-oss-4096
slope "$l" 4096 llama-4096-1
peer "$l" 4096 0,1 llama-4096
peer "$g" 16384 0 gpt-oss-16384-fa0 -- --no-warmup
for n in 4096 16384; do slope "$g" "$n" "gpt-oss-$n-2"; done
slope "$l" 4096 llama-4096-2
probe end
