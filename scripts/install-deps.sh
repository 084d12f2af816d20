#!/usr/bin/env bash
# Installs SLOPE's dependencies from Debian 12 packages (idempotent). With no argument: what the
# slope binary needs to build and run (the quickstart). With --tests: also what the tests and
# benchmarks need (scripts/test.sh).
set -euo pipefail
# libdnnl-dev's CMake config calls find_package(OpenCL) (Debian builds oneDNN with its OpenCL
# runtime), but only *recommends* the packages that satisfy it; we install with
# --no-install-recommends, so they are named here.
pkgs=(cmake g++ make libgomp1 libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev pkg-config libpcre2-dev libutf8proc-dev)
for arg in "$@"; do
  case "$arg" in
    --tests) pkgs+=(libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libblis-dev gnuplot-nox python3 python3-venv) ;;
    *) echo "install-deps.sh: unknown option '$arg' (use --tests)" >&2; exit 2 ;;
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
