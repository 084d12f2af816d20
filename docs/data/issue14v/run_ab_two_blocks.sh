#!/usr/bin/env bash
# In-process A/B of the AVX2 attention kernel's two-block units against one-block units:
# issue14u/two-blocks.patch on 6aa43ea (SLOPE_AVX2_QB2=1 selects two blocks a unit), with the
# switch read once a call instead of once a process, and ab_two_blocks.cpp, which alternates the
# two on the same inputs in one process (the order reversed every other pair).
# Usage: run_ab_two_blocks.sh SECONDS_PER_SHAPE [TOKENS,HQ,HKV,WINDOW ...]
#   THREADS (default 2); WT, the worktree it builds in (default /tmp/wt-two-blocks).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
wt="${WT:-/tmp/wt-two-blocks}"
if [ ! -x "$wt/ab_two_blocks" ]; then
  [ -d "$wt" ] || git -C "$repo" worktree add -f --detach "$wt" 6aa43ea > /dev/null
  f="$wt/src/slope/kernels/cpu/attention_avx2.cpp"
  git -C "$wt" checkout -- src/slope/kernels/cpu/attention_avx2.cpp
  git -C "$wt" apply "$repo/docs/data/issue14u/two-blocks.patch"
  sed -i '/static const bool qb2 = /d' "$f"
  sed -i 's|^#pragma omp parallel$|  const bool qb2 = std::getenv("SLOPE_AVX2_QB2") \&\& std::atoi(std::getenv("SLOPE_AVX2_QB2")) == 1;\n#pragma omp parallel|' "$f"
  grep -q '^  const bool qb2 = ' "$f"
  (cd "$wt" && cmake --preset release > /dev/null && cmake --build build/release -j2 --target slope_kernels slope_core > /dev/null)
  c++ -O3 -DNDEBUG -march=native -fopenmp -std=c++20 -I"$wt/src" "$here/ab_two_blocks.cpp" -o "$wt/ab_two_blocks" \
    "$wt/build/release/libslope_kernels.a" "$wt/build/release/libslope_core.a" -ldnnl -lgomp -lpthread
fi
OMP_NUM_THREADS="${THREADS:-2}" "$wt/ab_two_blocks" "$@"
