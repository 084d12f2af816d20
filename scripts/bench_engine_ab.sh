#!/usr/bin/env bash
# Two slope binaries, A and B, on the same model and prompt lengths, interleaved (A B A B ...)
# so that the shared machine's drifting speed falls on both alike; a peak probe before and after.
# Prints one JSON line per run: {"binary", "tokens", "ttft_ms", "tokens_per_s", ...}.
#   scripts/bench_engine_ab.sh A_BIN B_BIN MODEL_DIR [TOKENS (4096,16384)] [REPS (2)] [DTYPE (bf16)]
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 model=$3 lengths=${4:-4096,16384} reps=${5:-2} dtype=${6:-bf16}
echo "{\"peak_before\": $(scripts/peak_probe.sh)}"
for rep in $(seq "$reps"); do
  for n in ${lengths//,/ }; do
    for bin in "$a" "$b"; do
      "$bin" run --model "$model" --random-tokens "$n" --seed 1 --dtype "$dtype" --threads 2 --json 2>/dev/null |
        python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print(json.dumps({'binary': '$bin', 'rep': $rep, 'tokens': j['num_tokens'], 'ttft_ms': round(j['ttft_ms'], 1), 'tokens_per_s': round(j['tokens_per_s'], 1), 'gflops_per_s': round(j['gflops_per_s'], 1)}))"
    done
  done
done
echo "{\"peak_after\": $(scripts/peak_probe.sh)}"
