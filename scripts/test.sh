#!/usr/bin/env bash
# Builds and runs every test: unit tests, transformers fixtures and MPI tests (release build),
# then the loader and CLI tests again under AddressSanitizer/UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash scripts/build.sh release
ctest --preset release -j1 --timeout 900
cmake --preset asan >/dev/null
cmake --build --preset asan --target test_core test_model
ASAN_OPTIONS=detect_leaks=1 ctest --preset asan -j2 -R '^(Safetensors|Config|MakeModel|Tensor|Core)' --timeout 600
