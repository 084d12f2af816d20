#!/usr/bin/env bash
# Every figure of docs/performance.md in one sequential run (about an hour on the 2-core
# machines; run it on an otherwise idle machine). Results go to bench-results/.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench-results
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log() { echo "=== $(date +%T) $*"; }
log kernels
build/release/bench/bench_peak > bench-results/peak.txt 2>&1
build/release/bench/bench_attention --benchmark_min_time=0.5 > bench-results/attention.txt 2>&1
build/release/bench/bench_gemm --benchmark_min_time=0.3 > bench-results/gemm.txt 2>&1
OMP_NUM_THREADS=2 build/release/bench/bench_moe > bench-results/moe.txt 2>&1
log "end to end, one rank"
OUT=bench-results/e2e.jsonl scripts/bench_e2e.sh "1024 4096 16384 32768" "bf16 f32" gpt-oss
log "parallel schemes, shared memory"
OUT=bench-results/scaling.jsonl scripts/bench_scaling.sh "4096 8192 16384 32768" "1x1 1x2 u2 r2 pp2 tp2"
log "ring over TCP"
MCA="--mca btl tcp,self" OUT=bench-results/scaling-tcp.jsonl scripts/bench_scaling.sh "8192 16384" "r2 u2"
log "peer: llama.cpp and SLOPE on the same llama and gpt-oss bench models"
OUT=bench-results/e2e-peer.jsonl scripts/bench_e2e.sh "1024 4096" bf16 llama
scripts/bench_peer.sh --model models/bench-llama-bf16 -p 1024,4096 --fa 0,1 -r 2 > bench-results/peer-llama.txt 2>&1
OUT=bench-results/e2e-peer.jsonl scripts/bench_e2e.sh "1024 4096" bf16 gpt-oss
scripts/bench_peer.sh --arch gpt-oss --model models/bench-gpt-oss-bf16 -p 1024,4096 --fa 0,1 -r 2 > bench-results/peer-gptoss.txt 2>&1
log done
