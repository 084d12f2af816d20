#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo with what the Python fuzz target needs
# (fuzz/requirements.txt: atheris and numpy) and prints its python. The venv is
# $SLOPE_FUZZ_VENV, by default ~/.cache/slope/venv-fuzz.
#   scripts/fuzz-venv.sh           make it if needed (PyPI); exits 77 when PyPI cannot be reached
#   scripts/fuzz-venv.sh --check   only look: print its python, or exit 77 saying how to make it
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_FUZZ_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-fuzz}"
# shellcheck source=scripts/pinned-venv.sh
. "$root/scripts/pinned-venv.sh"
pinned_venv "$venv" "${1:-}" "scripts/fuzz-venv.sh (or set SLOPE_FUZZ_VENV)" "fuzz/fuzz_kv_client.py needs them" \
  "$root/fuzz/requirements.txt"
