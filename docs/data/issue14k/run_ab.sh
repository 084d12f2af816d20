#!/usr/bin/env bash
# Issue 14, eleventh window: two builds alternated, ROUNDS times: bench_attention's bf16 shapes (the
# AMX kernel, BM_SelfAttentionBf16, and the vdpbf16ps kernel, BM_SelfAttentionBf16Dot) at 4K, 16K
# and 32K, then gpt-oss bench prefills at 4K, 16K and 32K (../issue14i/helpers.sh), each step with
# the peak probes; then, once, PyTorch's CPU SDPA on the causal shapes and llama.cpp (fa on) at 4K
# and 16K. A and B are folders holding each build's `slope` and `bench_attention`.
# Usage: run_ab.sh OUT_DIR ROUNDS A B
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1" rounds="$2" a="$3" b="$4"
source docs/data/issue14i/helpers.sh
begin
py="$SLOPE_REF_VENV/bin/python"
for r in $(seq "$rounds"); do
  for bin in "$a" "$b"; do
    OMP_NUM_THREADS=2 "$bin/bench_attention" \
      --benchmark_filter='BM_SelfAttentionBf16(Dot)?/tokens:(4096|16384|32768)/' \
      --benchmark_min_time=0.4 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    n = b["name"].split("/")
    print(sys.argv[1], sys.argv[2], n[0], "/".join(n[1:6]), "GFLOP/s", round(b["GFLOP/s"], 1))' \
      "$r" "$bin" | tee -a "$out/kernels.txt"
    probe "kernels-$r-$(basename "$bin")"
  done
  for bin in "$a" "$b"; do
    for n in 4096 16384 32768; do
      SLOPE_BIN="$bin/slope" slope models/bench-gpt-oss-bf16 "$n" "gpt-oss-$n-$r-$(basename "$bin")"
    done
  done
done
"$py" scripts/bench_sdpa_cpu.py --threads 2 --lengths 4096,16384,32768 --heads 4 --kv-heads 1 \
  --window 0 --reps 3 | tee "$out/sdpa.txt"
probe sdpa
peer models/bench-gpt-oss-bf16 4096 1 gpt-oss-4096-fa1
peer models/bench-gpt-oss-bf16 16384 1 gpt-oss-16384-fa1 -- --no-warmup
probe end
