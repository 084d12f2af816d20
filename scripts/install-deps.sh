#!/usr/bin/env bash
# Installs SLOPE's dependencies from Debian 12 packages (idempotent).
#   scripts/install-deps.sh          what the slope binary needs to build and run, and python3 with
#                                    venv for the quickstart's serving demo (the openai client)
#   scripts/install-deps.sh --tests  also what the tests and benchmarks need (scripts/test.sh)
#   scripts/install-deps.sh --fuzz   also clang 14 with libFuzzer and its OpenMP (scripts/fuzz.sh)
set -euo pipefail
# libdnnl-dev's CMake config calls find_package(OpenCL) (Debian builds oneDNN with its OpenCL
# runtime), but only *recommends* the packages that satisfy it; we install with
# --no-install-recommends, so they are named here.
pkgs=(cmake g++ make libgomp1 libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev pkg-config libpcre2-dev libutf8proc-dev
      libcpp-httplib-dev python3 python3-venv)
for arg in "$@"; do
  case "$arg" in
    --tests) pkgs+=(libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libblis-dev gnuplot-nox iproute2) ;;
    # clang++ and -fsanitize=fuzzer,address,undefined (libclang-rt-14-dev); libomp for OpenMP.
    --fuzz) pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev) ;;
    *) echo "install-deps.sh: unknown option '$arg' (use --tests and/or --fuzz)" >&2; exit 2 ;;
  esac
done
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
