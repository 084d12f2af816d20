#!/usr/bin/env bash
# Issue 14, twelfth window (the AMX machine): context parallelism. bench_cp_overlap (ring 2, 1 thread a
# rank, 16K and 32K tokens, bf16 compute on the AMX kernel) with CMA and without
# (btl_vader_single_copy_mechanism none), the progress thread off and on; then gpt-oss bench bf16
# prefills, 1 rank x 1 thread against 2 ranks x 1 thread (ring 2, Ulysses 2) at 16K and 32K
# (scripts/bench_scaling.sh). Peak probes between the steps (../issue14i/helpers.sh).
# Usage: run_cp.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for n in 16384 32768; do
  for cma in on off; do
    mca=(); [ "$cma" = on ] || mca=(--mca btl_vader_single_copy_mechanism none)
    for t in 0 1; do
      echo "## tokens $n, CMA $cma, progress thread $t" >> "$out/cp_overlap.txt"
      OMP_NUM_THREADS=1 mpirun "${mca[@]}" -np 2 build/release/bench/bench_cp_overlap --ring 2 \
        --tokens "$n" --reps 2 --progress-thread "$t" --compute bf16 >> "$out/cp_overlap.txt" 2>&1
      probe "cp-$n-cma-$cma-thread-$t"
    done
  done
done
OUT="$out/scaling.jsonl" scripts/bench_scaling.sh "16384 32768" "1x1 r2 u2" > /dev/null
probe scaling
