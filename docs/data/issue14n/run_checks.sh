#!/usr/bin/env bash
# Issue 14, fourteenth window: the 4096-row MoE calls on two-rank meshes against one rank
# (slope run --check, gpt-oss bench bf16, 9000 tokens: calls of 4096 rows and a short last one),
# TP 2 and ring 2, then --moe-chunk 1024 under TP 2; and a 64K prefill with its predicted memory.
# Usage: run_checks.sh > checks.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
m=models/bench-gpt-oss-bf16
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
for args in "--tp 2" "--ring 2" "--tp 2 --moe-chunk 1024"; do
  echo "== $args"
  # shellcheck disable=SC2086
  "${mpi[@]}" build/release/slope run --model $m --random-tokens 9000 --seed 3 --threads 1 --check $args 2>&1 | tail -1
done
echo "== 65536 tokens, --dry-run"
build/release/slope run --model $m --random-tokens 65536 --dry-run 2>&1 | tail -4
echo "== 65536 tokens, 1 rank x 2 threads; probe $(scripts/peak_probe.sh)"
build/release/slope run --model $m --random-tokens 65536 --seed 1 --threads 2 --json |
  python3 -c 'import json, sys; j = json.load(sys.stdin); print("tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"], "peak_GB", round(j["peak_memory_bytes"] / 1e9, 2))'
echo "probe $(scripts/peak_probe.sh)"
