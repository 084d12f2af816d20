#!/usr/bin/env bash
# This machine's hardware profiles, one per rank layout the validation uses (docs/planner.md
# section 6): 1 rank x 2 threads, 1 x 1, 2 ranks x 1 thread (shared memory) and 4 ranks x 1
# thread oversubscribed on the 2 cores. Every rank of a layout measures at the same time, so
# shared caches, memory and cores are shared as in a run. The engine object is measured at
# the bench model's shapes; the 2-rank profile's network is MPI over TCP loopback. Run it on
# an otherwise idle machine (about 5 minutes).
# Usage: scripts/calibrate_profiles.sh   (FP32_PEAK / BF16_PEAK: per-thread GFLOP/s peaks,
#        default this Zen 4 VM's bench_peak figures; MODEL: default models/bench-gpt-oss-bf16)
set -euo pipefail
cd "$(dirname "$0")/.."
slope=build/release/slope
model="${MODEL:-models/bench-gpt-oss-bf16}"
peaks=(--fp32-peak-per-thread "${FP32_PEAK:-116}" --bf16-peak-per-thread "${BF16_PEAK:-231}")
[ -f "$model/model.safetensors" ] || "$slope" make-model --arch gpt-oss --preset bench --seed 1 --dtype bf16 --out "$model"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
calibrate() {  # name ranks threads max-attention-tokens description
  local out="profiles/$1.json" mpi=()
  [ "$2" -eq 1 ] || mpi=(mpirun -np "$2" --oversubscribe)
  rm -f "$out"
  echo "=== $(date +%T) $1"
  "${mpi[@]}" "$slope" calibrate --out "$out" --name "$1" --threads "$3" --model "$model" --dtype bf16 \
    --attention-max-tokens "$4" "${peaks[@]}" > /dev/null
  python3 - "$out" "$5" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); p["description"] = sys.argv[2]
json.dump(p, open(sys.argv[1], "w"), indent=2); open(sys.argv[1], "a").write("\n")
PY
}
calibrate cpu-zen4-2c 1 2 32768 "this 2-vCPU VM as 1 rank x 2 threads"
calibrate cpu-zen4-1c 1 1 32768 "this 2-vCPU VM as 1 rank x 1 thread (the other core idle)"
calibrate cpu-zen4-2x1 2 1 32768 "this 2-vCPU VM as 2 ranks x 1 thread over shared memory"
# The "network" of the 2-rank profile: MPI over TCP loopback, standing in for a link between
# nodes (this machine has no second node).
mpirun -np 2 --mca btl tcp,self "$slope" calibrate --out profiles/cpu-zen4-2x1.json --link inter --threads 1 > /dev/null
python3 - profiles/cpu-zen4-2x1.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["network"]["description"] = "Open MPI over TCP loopback between the 2 ranks (btl tcp,self), measured by slope calibrate --link inter"
json.dump(p, open(sys.argv[1], "w"), indent=2); open(sys.argv[1], "a").write("\n")
PY
calibrate cpu-zen4-4x1-oversub 4 1 32768 "this 2-vCPU VM as 4 ranks x 1 thread, two per core (U2 x R2 needs 4 ranks)"
echo "=== $(date +%T) done"
