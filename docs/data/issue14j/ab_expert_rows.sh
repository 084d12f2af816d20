#!/usr/bin/env bash
# The MoE's expert row chunk (kExpertRows in ops/cpu/backend_cpu.cpp) against whole experts, in
# alternated gpt-oss bench prefills, each with its own peak probe. SLOPE_BIN is a build with
# expert-rows-env.patch applied (the chunk read from $XROWS; 100000 = whole experts). Usage:
#   SLOPE_BIN=/path/to/slope ab_expert_rows.sh ROUNDS TOKENS "100000 128 ..." [slope run flags] > OUT.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds="$1" tokens="$2" rows="$3"; shift 3
for r in $(seq "$rounds"); do
  for x in $rows; do
    XROWS=$x "$SLOPE_BIN" run --model models/bench-gpt-oss-bf16 --random-tokens "$tokens" --seed 1 --threads 2 --json "$@" 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(sys.argv[1], sys.argv[2], "rows", sys.argv[3], "tok/s", round(j["tokens_per_s"], 1), "mlp_ms", round(j["phases"]["mlp_ms"]), "units", j["bf16_units"], "first", j["first_token"])' "$r" "$tokens" "$x"
  done
  echo "probe $(scripts/peak_probe.sh)"
done
