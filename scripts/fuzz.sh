#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for a
# bounded time on its seed corpus (fuzz/corpus/<target>/). Exits non-zero if any target finds a
# crash, a sanitizer report, an uncaught exception, a leak or a hang (over 10 s on one input).
# kv_client is the Python client's target (fuzz/fuzz_kv_client.py, atheris), run with the venv
# of scripts/fuzz-venv.sh; where PyPI cannot be reached to make it, it is skipped, saying so.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s; all targets)
#
# New inputs go to build/fuzz/corpus/<target>/ (the seeds in the repository stay as they are),
# findings to build/fuzz/findings/<target>-*; reproduce one with build/fuzz/fuzz/fuzz_<target> FILE
# (kv_client: PYTHON fuzz/fuzz_kv_client.py FILE). Needs clang and libclang-rt
# (scripts/install-deps.sh --fuzz). docs/reliability.md has the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
all=(safetensors weight_index config tokens kv_shard profile plan_strings tokenizer http_bodies kvx_service kv_client)
targets=("${@:-${all[@]}}")
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz.sh: seconds per target must be a positive integer, got '$seconds'" >&2; exit 2; }

for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2; exit 2; }
done
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=abort_on_error=0:detect_leaks=1
failed=()
skipped=0
for t in "${targets[@]}"; do
  bin=(build/fuzz/fuzz/fuzz_$t) seeds=fuzz/corpus/$t work=build/fuzz/corpus/$t
  if [ "$t" = kv_client ]; then
    if ! py=$(scripts/fuzz-venv.sh 2>build/fuzz/venv.log); then
      echo "== fuzz_$t: SKIPPED, no venv with atheris ($(tail -1 build/fuzz/venv.log))"
      skipped=$((skipped + 1))
      continue
    fi
    bin=("$py" fuzz/fuzz_kv_client.py)
  fi
  mkdir -p "$work" build/fuzz/findings
  log=build/fuzz/$t.log
  echo "== fuzz_$t: ${seconds} s"
  if "${bin[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="build/fuzz/findings/$t-" "$work" "$seeds" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log")  # atheris prints no final stats
    echo "   ok: ${runs:-?} executions, corpus $(ls "$work" | wc -l) files"
  else
    failed+=("$t")
    echo "   FAILED: see $log"
    grep -m1 -E "ERROR: |runtime error|uncaught exception|Uncaught Python exception|deadly signal|Timeout|out-of-memory" "$log" |
      sed 's/^/   /' || true
    ls build/fuzz/findings/"$t"-* 2>/dev/null | sed 's/^/   finding: /' || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
note=""
[ "$skipped" -eq 0 ] || note=" ($skipped skipped: see above)"
echo "fuzz.sh: no findings in $((${#targets[@]} - skipped)) targets$note"
