#!/bin/bash
# run_ab16.sh ROUNDS BUILD_DIR...: bench_attention's bf16 causal 16K (4 / 1 heads, head_dim 64) GFLOP/s of each build, alternated
rounds=$1; shift
for r in $(seq $rounds); do for d in "$@"; do
  g=$(OMP_NUM_THREADS=2 $d/bench/bench_attention --benchmark_filter='BM_SelfAttentionBf16/tokens:16384/Hq:4/' --benchmark_min_time=0.5 2>/dev/null | grep -o 'GFLOP/s=[0-9.]*' | cut -d= -f2)
  echo "$d $g"
done; done
