#!/usr/bin/env bash
# In-process A/B of the AVX2 kernel's unit size on 3fee983: slots.patch makes the slots of a unit
# (AB_SLOTS, at most 16) and its blocks of 16 positions (AB_BLOCKS, at most 4) per-call settings;
# ab_slots.cpp (ab_two_blocks.cpp with ab_slots.diff) alternates A, 3fee983's 8 slots and 2
# blocks, with B (B_SLOTS and B_BLOCKS, default 16 and 4) on the same inputs in one process.
# Usage: run_ab_slots.sh SECONDS_PER_SHAPE [TOKENS,HQ,HKV,WINDOW ...]
#   THREADS (default 2); WT, the worktree it builds in (default /tmp/wt-slots).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
wt="${WT:-/tmp/wt-slots}"
if [ ! -x "$wt/ab_slots" ]; then
  [ -d "$wt" ] || git -C "$repo" worktree add -f --detach "$wt" 3fee983 > /dev/null
  git -C "$wt" checkout -- src/slope/kernels/cpu/attention_avx2.cpp
  git -C "$wt" apply "$here/slots.patch"
  (cd "$wt" && cmake --preset release > /dev/null && cmake --build build/release -j2 --target slope_kernels slope_core > /dev/null)
  patch -s -o "$wt/ab_slots.cpp" "$here/ab_two_blocks.cpp" "$here/ab_slots.diff"
  c++ -O3 -DNDEBUG -march=native -fopenmp -std=c++20 -I"$wt/src" "$wt/ab_slots.cpp" -o "$wt/ab_slots" \
    "$wt/build/release/libslope_kernels.a" "$wt/build/release/libslope_core.a" -ldnnl -lgomp -lpthread
fi
OMP_NUM_THREADS="${THREADS:-2}" "$wt/ab_slots" "$@"
