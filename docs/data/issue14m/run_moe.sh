#!/usr/bin/env bash
# Issue 14, thirteenth window: the MoE against the dense MLP of the same FLOPs (bench_moe, 2
# threads, ROUNDS repetitions), then gpt-oss bench prefills at 4K / 16K / 32K with --chunk (tokens
# per chunk of the token-local work, so per MoE call) 1024, 2048 and 4096, alternated ROUNDS times;
# a peak probe before and after each part. Usage: run_moe.sh ROUNDS > moe.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1"
echo "probe $(scripts/peak_probe.sh)"
OMP_NUM_THREADS=2 build/release/bench/bench_moe --benchmark_repetitions="$rounds" 2>/dev/null |
  grep -oE '^BM_[A-Za-z]+/[^ ]*|GFLOP/s=[0-9.k]+' | paste -d' ' - -
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for n in 4096 16384 32768; do
    for c in 1024 2048 4096; do
      build/release/slope run --model models/bench-gpt-oss-bf16 --random-tokens "$n" --seed 1 --threads 2 --json --chunk "$c" 2>/dev/null |
        python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], "tokens", sys.argv[2], "chunk", sys.argv[3], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_GB", round(j["peak_memory_bytes"] / 1e9, 2))' "$r" "$n" "$c"
    done
  done
done
echo "probe $(scripts/peak_probe.sh)"
