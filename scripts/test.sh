#!/usr/bin/env bash
# Builds and runs every test: kernels, loader, transformers fixtures, CLI, planner, MPI
# (context-parallel, pipeline, tensor-parallel) tests in a release build; then the loader,
# core and CLI-input tests again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash scripts/build.sh release
ctest --preset release -j2 --timeout 900
cmake --preset asan >/dev/null
cmake --build --preset asan --target test_model test_core
ASAN_OPTIONS=detect_leaks=1 build/asan/tests/test_model
ASAN_OPTIONS=detect_leaks=1 build/asan/tests/test_core
