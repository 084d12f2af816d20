#!/usr/bin/env bash
# Whole prefill of MODEL at each of LENGTHS, 1 rank x 2 threads, three ways alternated ROUNDS
# times: bf16 on the bf16 units, bf16 on the f32 units, and --dtype f32 (the same bf16
# checkpoint), each run between two peak probes. One JSON line per run (slope run --json plus
# "config" and "peak_probe"). Usage: ab_units.sh MODEL "LENGTHS" ROUNDS > OUT.jsonl
set -euo pipefail
cd "$(dirname "$0")/../../.."
model="$1"; lengths="$2"; rounds="${3:-2}"
for n in $lengths; do
  for r in $(seq "$rounds"); do
    for cfg in "--dtype bf16 --bf16-units bf16" "--dtype bf16 --bf16-units f32" "--dtype f32"; do
      before=$(scripts/peak_probe.sh)
      # shellcheck disable=SC2086
      result=$(build/release/slope run --model "$model" --random-tokens "$n" --seed 1 --threads 2 $cfg --json)
      after=$(scripts/peak_probe.sh)
      python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['config']=sys.argv[4]; j['round']=int(sys.argv[5]); j['peak_probe']=[json.loads(sys.argv[2]), json.loads(sys.argv[3])]; print(json.dumps(j))" \
        "$result" "$before" "$after" "$cfg" "$r"
    done
  done
done
