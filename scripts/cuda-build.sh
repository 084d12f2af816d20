#!/usr/bin/env bash
# Configures and builds the CUDA variant compile-only (-DSLOPE_CUDA=ON, the `cuda` preset:
# slope_cuda, slope_nccl and the GPU tests, nvcc for sm_80 and sm_90), then runs the GPU tests,
# which skip where there is no GPU (the checks that need no device still run). For CI on a
# machine with nvcc, cuBLAS and NCCL but no GPU. About 1.5 minutes from clean on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "cuda-build: nvcc not found (install the CUDA toolkit, or skip the CUDA variant)" >&2
  exit 1
}
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s)
cmake --preset cuda >/dev/null
cmake --build --preset cuda
ctest --preset cuda --timeout 300
echo "cuda-build: configured, built and tested (skips without a GPU) in $(( $(date +%s) - start )) s"
