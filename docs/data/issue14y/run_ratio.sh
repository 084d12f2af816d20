#!/bin/bash
# Window-128 whole calls against the causal 16K call (issue14x/ratio.cpp), built against this
# tree ("new") and 0d0ec01 ("old"), three processes each, alternated; a bf16 probe after each.
cd /tmp/w
probe() { OMP_NUM_THREADS=2 /work/main/build/release/bench/bench_peak 2>&1 | grep -o 'Bf16Dot/2.*GFLOP/s=[0-9.]*' | sed 's/.*=/bf16 probe /'; }
echo "# $(date -u +%FT%TZ) issue14x/ratio.cpp built against the new tree (8dbfd01) as 'new' and 0d0ec01 as 'old', alternated; 8 pairs each"
probe
for i in 1 2 3; do
  for v in new old; do
    echo "== $v"; OMP_NUM_THREADS=2 ./ratio_$v 8; probe
  done
done
