#!/usr/bin/env bash
# Prints {"fp32": GFLOP/s, "bf16": GFLOP/s} measured now with THREADS threads (bench_peak), so
# a benchmark can be compared with the machine's peak in the same run: the shared machines'
# throughput moves by 2x within minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
t="${THREADS:-2}"
build/release/bench/bench_peak --benchmark_filter="/$t/" --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = {("fp32" if "Fp32" in b["name"] else "bf16"): round(b["GFLOP/s"], 1) for b in d["benchmarks"]}
print(json.dumps(r))'
