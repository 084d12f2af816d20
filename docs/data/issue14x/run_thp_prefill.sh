#!/usr/bin/env bash
# Issue 14, twenty-fourth window (a Zen 4): the gpt-oss bench bf16 prefill (1 rank x 2 threads)
# with the system's transparent huge pages at "madvise" (Tensors of 2 MiB or more in huge pages,
# core/tensor.cpp) and at "never" (every tensor on 4 KiB pages), alternated with one binary:
# 4K three times each, 16K twice each, a peak probe around each run. Restores the setting it
# found. Needs root. Usage: run_thp_prefill.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="$1"
source docs/data/issue14i/helpers.sh
begin
thp=/sys/kernel/mm/transparent_hugepage/enabled
was=$(sed -E 's/.*\[(.*)\].*/\1/' "$thp")
trap 'echo "$was" > "$thp"' EXIT
g=models/bench-gpt-oss-bf16
for n in 4096 4096 4096 16384 16384; do
  for mode in madvise never; do
    echo "$mode" > "$thp"
    slope "$g" "$n" "gpt-oss-$n-thp-$mode"
  done
done
probe end
