#!/usr/bin/env bash
# Prints {"fp32": GFLOP/s, "bf16": GFLOP/s} measured now with THREADS threads (bench_peak), so a
# benchmark can be compared with the machine's peak in the same run: the shared machines'
# throughput moves by 2x within minutes. Also "bf16_on": "fp32 FMA" where the CPU has no bf16
# dot instruction (bf16 then runs at the fp32 figure), and "bf16_amx" where the CPU has AMX and
# the kernel grants it (oneDNN's bf16 matmul and the AMX attention run there).
set -euo pipefail
cd "$(dirname "$0")/.."
t="${THREADS:-2}"
build/release/bench/bench_peak --benchmark_filter="/$t/" --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
key = lambda n: "fp32" if "Fp32" in n else "bf16_amx" if "Amx" in n else "bf16"
r = {key(b["name"]): round(b["GFLOP/s"], 1) for b in d["benchmarks"] if "error_occurred" not in b}
if "bf16" not in r:  # no bf16 arithmetic (AVX2 only): bf16 Linears run on the FMA units
    r["bf16"] = r["fp32"]
    r["bf16_on"] = "fp32 FMA"
print(json.dumps(r))'
