#!/usr/bin/env bash
# SLOPE's attention kernel against llama.cpp's CPU flash attention on llama.cpp's own prefill-sized
# perf case (5776 queries x 5776 keys, 16 heads, D 72, no mask, f16 K/V), one thread each: the
# thread count test-backend-ops gives its CPU backend (hardware threads / 2) on a 2-vCPU machine.
# ROUNDS rounds, each after a peak probe: bench_attention's BM_NoMask (f32) and BM_NoMaskBf16
# (the same shape), then test-backend-ops perf. test-backend-ops is built by
#   SLOPE_REF_VENV=/root/.cache/slope/venv-kv scripts/bench_peer.sh --build-only --with-test-backend-ops
# Usage: run_fa_peer.sh ROUNDS [TEST_BACKEND_OPS] > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
. scripts/llamacpp-sdist.sh   # LCP_VERSION: bench_peer.sh builds into $SLOPE_PEER_DIR/build-$LCP_VERSION
tbo="${2:-${SLOPE_PEER_DIR:-/opt/peer}/build-$LCP_VERSION/bin/test-backend-ops}"
for r in $(seq "${1:-3}"); do
  echo "round $r probe $(scripts/peak_probe.sh)"
  OMP_NUM_THREADS=1 build/release/bench/bench_attention --benchmark_filter='BM_NoMask(Bf16)?/' \
    --benchmark_min_time=4 2>/dev/null | grep '^BM_'
  "$tbo" perf -b CPU -o FLASH_ATTN_EXT \
    -p 'hsk=72,hsv=72,nh=16,nr23=\[1,1\],kv=5776,nb=5776,mask=0,.*type_K=f16,type_V=f16' 2>&1 | grep 'FLASH_ATTN_EXT(' | sed 's/\x1b\[[0-9;]*m//g'
done
echo "end probe $(scripts/peak_probe.sh)"
