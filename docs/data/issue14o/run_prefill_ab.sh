#!/usr/bin/env bash
# gpt-oss bench prefills (bf16, 1 rank x 2 threads) with two builds' slope, alternated ROUNDS
# times at each length; a peak probe before and after each round.
# Usage: run_prefill_ab.sh ROUNDS BASE_BUILD NEW_BUILD [SIZES]  (each a build/release directory)
set -euo pipefail
rounds="$1" base="$2" new="$3" sizes="${4:-4096 16384 32768}"
cd "$(dirname "$0")/../../.."
echo "probe $(scripts/peak_probe.sh)"
for r in $(seq "$rounds"); do
  for n in $sizes; do
    for b in base new; do
      dir="$base"; [ "$b" = new ] && dir="$new"
      "$dir/slope" run --model models/bench-gpt-oss-bf16 --random-tokens "$n" --seed 1 --threads 2 --json 2>/dev/null |
        python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], sys.argv[2], "tokens", sys.argv[3], "tok/s", round(j["tokens_per_s"], 1), "phases_ms", {k: round(v) for k, v in j["phases"].items()}, "first", j["first_token"])' "$r" "$b" "$n"
    done
  done
  echo "probe $(scripts/peak_probe.sh)"
done
