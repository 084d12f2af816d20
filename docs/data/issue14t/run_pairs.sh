#!/usr/bin/env bash
# Issue 14, twentieth window (a Zen 3): SLOPE and llama.cpp alternated on the 4K targets. Each
# round runs SLOPE's llama `bench` prefill, llama-bench on the same model, SLOPE's gpt-oss `bench`
# prefill, llama-bench on it; a last SLOPE run of each model closes the run, so every llama.cpp
# run has a SLOPE run of its model on both sides. Round 1 runs llama.cpp with flash attention
# off and on, later rounds on only (its faster setting on this kind of machine, nineteenth
# window). Peak probes around every step (../issue14i/helpers.sh). Usage: run_pairs.sh OUT_DIR [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1" rounds="${2:-3}"
source docs/data/issue14i/helpers.sh
bench_models
begin
for r in $(seq "$rounds"); do
  fa=1; [ "$r" = 1 ] && fa=0,1
  slope "$l" 4096 "llama-4096-$r"
  peer "$l" 4096 "$fa" "llama-4096-$r"
  slope "$g" 4096 "gpt-oss-4096-$r"
  peer "$g" 4096 "$fa" "gpt-oss-4096-$r"
done
slope "$l" 4096 "llama-4096-end"
slope "$g" 4096 "gpt-oss-4096-end"
probe end
