#!/usr/bin/env bash
# Paired rounds of bench_attention with its buffers on 4 KiB pages (base) and on transparent huge
# pages (thp: glibc's malloc madvises its mmap'd chunks, and the fixed mmap threshold keeps every
# buffer of 1 MiB or more on mmap), the order reversed every other round, a peak probe before each.
# The machine's THP setting is madvise, so without the tunable no buffer gets huge pages.
# Usage: thp_ab.sh [ROUNDS]  (T threads, default 2; F a bench_attention filter; MT min time)
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=build/release/bench/bench_attention
F=${F:-'BM_SelfAttention/tokens:(4096|32768)/Hq:4/Hkv:1/D:64/window:0'}
run() { # $1 = base|thp
  local env=()
  [ "$1" = thp ] && env=(GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1048576)
  env "${env[@]}" OMP_NUM_THREADS=${T:-2} $B --benchmark_filter="$F" --benchmark_min_time=${MT:-2} 2>/dev/null |
    awk -v m=$1 '/^BM_/{split($1,a,"/"); for(i=1;i<=NF;i++) if($i ~ /^GFLOP\/s=/){sub("GFLOP/s=","",$i); sub("/s","",$i); printf "%s %s %s %s\n", m, a[2], a[3], $i}}'
}
for r in $(seq 1 ${1:-6}); do
  echo "round $r probe $(THREADS=${T:-2} scripts/peak_probe.sh)"
  if [ $((r % 2)) = 1 ]; then run base; run thp; else run thp; run base; fi
done
