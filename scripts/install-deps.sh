#!/usr/bin/env bash
# Installs SLOPE's build and test dependencies from Debian 12 packages (idempotent).
#   scripts/install-deps.sh          what building and testing need
#   scripts/install-deps.sh --fuzz   also clang 14 with libFuzzer and its OpenMP (scripts/fuzz.sh)
set -euo pipefail
# libdnnl-dev's CMake config calls find_package(OpenCL) (Debian builds oneDNN with its OpenCL
# runtime), but only *recommends* the packages that satisfy it; we install with
# --no-install-recommends, so they are named here.
pkgs=(cmake g++ make libgomp1 libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libblis-dev
      gnuplot-nox python3)
if [ "${1:-}" = "--fuzz" ]; then
  # clang++ and -fsanitize=fuzzer,address,undefined (libclang-rt-14-dev); libomp for OpenMP.
  pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev)
elif [ $# -gt 0 ]; then
  echo "usage: scripts/install-deps.sh [--fuzz]" >&2
  exit 2
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
