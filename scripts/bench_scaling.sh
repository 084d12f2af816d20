#!/usr/bin/env bash
# Parallel schemes side by side on this machine: 1 rank x 1 thread, 1 rank x 2 threads, and
# 2 ranks x 1 thread as Ulysses 2, ring 2, pipeline 2 (chunked) and tensor parallel 2 (and
# u2r2: 4 ranks x 1 thread, two per core, when asked for), on the
# gpt-oss-shaped bench model (bf16) at several prompt lengths. One JSON line per run goes to
# OUT (default bench-results/scaling.jsonl); scripts/bench_scaling.py makes the tables.
# Usage: scripts/bench_scaling.sh [LENGTHS] [CONFIGS]   (MCA="--mca btl tcp,self" for TCP)
set -euo pipefail
cd "$(dirname "$0")/.."
lengths="${1:-4096 8192 16384 32768}"
configs="${2:-1x1 1x2 u2 r2 pp2 tp2}"
dtype="${DTYPE:-bf16}"
out="${OUT:-bench-results/scaling.jsonl}"
slope=build/release/slope
model="models/bench-gpt-oss-$dtype"
[ -f "$model/model.safetensors" ] || "$slope" make-model --arch gpt-oss --preset bench --seed 1 --dtype "$dtype" --out "$model"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out")"
for n in $lengths; do
  for c in $configs; do
    common=(run --model "$model" --random-tokens "$n" --seed 1 --dtype "$dtype" --json)
    case "$c" in
      1x1) cmd=("$slope" "${common[@]}" --threads 1) ;;
      1x2) cmd=("$slope" "${common[@]}" --threads 2) ;;
      u2)  cmd=(mpirun ${MCA:-} -np 2 "$slope" "${common[@]}" --threads 1 --ulysses 2) ;;
      r2)  cmd=(mpirun ${MCA:-} -np 2 "$slope" "${common[@]}" --threads 1 --ring 2) ;;
      pp2) cmd=(mpirun ${MCA:-} -np 2 "$slope" "${common[@]}" --threads 1 --pp 2) ;;
      tp2) cmd=(mpirun ${MCA:-} -np 2 "$slope" "${common[@]}" --threads 1 --tp 2) ;;
      u2r2) cmd=(mpirun ${MCA:-} -np 4 --oversubscribe "$slope" "${common[@]}" --threads 1 --ulysses 2 --ring 2) ;;
      *) echo "unknown config $c" >&2; exit 2 ;;
    esac
    "${cmd[@]}" | python3 -c "import json,sys; j=json.load(sys.stdin); j['config']='$c'; j['transport']='${MCA:-shm}'; print(json.dumps(j))" | tee -a "$out"
  done
done
