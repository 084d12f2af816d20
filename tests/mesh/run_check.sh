#!/usr/bin/env bash
# Runs one mesh test, `mpirun ... slope run ... --check`, and passes only if the whole job exits
# 0 AND rank 0 printed the one-rank check's PASS line: a rank that crashes after the check, or a
# run whose check never ran, fails the test.
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "mesh test: FAILED: the job exited with code $rc"
  exit 1
fi
if ! grep -q "check vs one rank: PASS" <<<"$out"; then
  echo "mesh test: FAILED: no 'check vs one rank: PASS' line"
  exit 1
fi
