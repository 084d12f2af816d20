#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for a
# bounded time on its seed corpus (fuzz/corpus/<target>/). Exits non-zero if any target finds a
# crash, a sanitizer report, an uncaught exception, a leak or a hang (over 10 s on one input).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s; all targets)
#
# New inputs go to build/fuzz/corpus/<target>/ (the seeds in the repository stay as they are),
# findings to build/fuzz/findings/<target>-*; reproduce one with build/fuzz/fuzz/fuzz_<target> FILE.
# Needs clang and libclang-rt (scripts/install-deps.sh --fuzz). docs/reliability.md has the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
all=(safetensors weight_index config tokens kv_shard profile plan_strings)
targets=("${@:-${all[@]}}")
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz.sh: seconds per target must be a positive integer, got '$seconds'" >&2; exit 2; }

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=abort_on_error=0:detect_leaks=1
failed=()
for t in "${targets[@]}"; do
  bin=build/fuzz/fuzz/fuzz_$t seeds=fuzz/corpus/$t work=build/fuzz/corpus/$t
  [[ -x "$bin" && -d "$seeds" ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2; exit 2; }
  mkdir -p "$work" build/fuzz/findings
  log=build/fuzz/$t.log
  echo "== fuzz_$t: ${seconds} s"
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="build/fuzz/findings/$t-" "$work" "$seeds" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "   ok: ${runs:-?} executions, corpus $(ls "$work" | wc -l) files"
  else
    failed+=("$t")
    echo "   FAILED: see $log"
    grep -m1 -E "ERROR: |runtime error|uncaught exception|deadly signal|Timeout|out-of-memory" "$log" | sed 's/^/   /' || true
    ls build/fuzz/findings/"$t"-* 2>/dev/null | sed 's/^/   finding: /' || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${#targets[@]} targets"
