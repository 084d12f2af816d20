#!/usr/bin/env bash
# Issue 14, eighth window: every figure of docs/performance.md's "eighth window" section, in one
# sequential run on an idle machine, each step between peak probes (timeline.txt). Needs the
# release build, models/bench-{gpt-oss,llama}-bf16, the KV venv (torch) and llama.cpp from
# scripts/bench_peer.sh --build-only. Usage: docs/data/issue14h/run_all.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"; mkdir -p "$out"
export SLOPE_REF_VENV="${SLOPE_REF_VENV:-/root/.cache/slope/venv-kv}"  # the GGUF converter's Python
probe() { echo "$(date -u +%H:%M:%S) $1 $(scripts/peak_probe.sh)" | tee -a "$out/timeline.txt"; }
lscpu > "$out/cpu.txt"
git rev-parse HEAD > "$out/commit.txt"
probe start
OMP_NUM_THREADS=2 build/release/bench/bench_attention \
  --benchmark_filter='BM_SelfAttention(Bf16)?/tokens:16384/Hq:4/Hkv:1/D:64/window:0' \
  --benchmark_repetitions=2 --benchmark_format=json > "$out/bench_attention.json"
probe attention
/root/.cache/slope/venv-kv/bin/python scripts/bench_sdpa_cpu.py --threads 2 --lengths 16384 --heads 4 --kv-heads 1 \
  --window 0 --reps 2 > "$out/sdpa.jsonl"
probe sdpa
docs/data/issue14h/ab_units.sh models/bench-gpt-oss-bf16 "4096" 2 > "$out/e2e-gpt-oss-4k.jsonl"
probe e2e-4k
docs/data/issue14h/ab_units.sh models/bench-gpt-oss-bf16 "16384" 1 > "$out/e2e-gpt-oss-16k.jsonl"
probe e2e-16k
scripts/bench_peer.sh -o jsonl -r 1 --model models/bench-gpt-oss-bf16 -p 4096 --fa 0,1 > "$out/peer-gpt-oss.jsonl"
probe peer-4k
scripts/bench_peer.sh -o jsonl -r 1 --model models/bench-gpt-oss-bf16 -p 16384 --fa 0,1 -- --no-warmup >> "$out/peer-gpt-oss.jsonl"
probe peer-16k
docs/data/issue14h/ab_units.sh models/bench-llama-bf16 "4096" 1 > "$out/e2e-llama-4k.jsonl"
probe llama-4k
scripts/bench_peer.sh -o jsonl -r 1 --model models/bench-llama-bf16 -p 4096 --fa 0,1 > "$out/peer-llama.jsonl"
probe peer-llama-4k
