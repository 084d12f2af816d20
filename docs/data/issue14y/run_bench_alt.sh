#!/bin/bash
# The benchmark, this tree ("new") and 0d0ec01 ("old") alternated, a bf16 probe after each.
probe() { OMP_NUM_THREADS=2 /work/main/build/release/bench/bench_peak 2>&1 | grep -o 'Bf16Dot/2.*GFLOP/s=[0-9.]*' | sed 's/.*=/bf16 probe /'; }
echo "# $(date -u +%FT%TZ) OMP_NUM_THREADS=2 bench_attention_window 3, new (8dbfd01) and old (0d0ec01) alternated"
probe
for i in 1 2; do
  for v in new old; do
    d=/work/main; [ $v = old ] && d=/tmp/w/old
    echo "== $v"; OMP_NUM_THREADS=2 $d/build/release/bench/bench_attention_window 3 | grep bf16; probe
  done
done
