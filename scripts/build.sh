#!/usr/bin/env bash
# Configures and builds one CMake preset with 2 jobs: release (everything: slope, tests,
# benchmarks; the default), app (the slope binary only, into the same build/release) or asan.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
