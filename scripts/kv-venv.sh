#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo for the KV hand-off checks against transformers
# (tests/kv/check_transformers.py), and prints its python. It holds exactly the pins that the
# reference fixtures were made with, tests/reference/requirements.txt (torch, transformers,
# safetensors, numpy), so that transformers here is the one whose K/V the fixtures hold. The
# venv is $SLOPE_KV_VENV, by default ~/.cache/slope/venv-kv.
#   scripts/kv-venv.sh           make it if needed (PyPI); exits 77 when PyPI cannot be reached
#   scripts/kv-venv.sh --check   only look: print its python, or exit 77 (CTest's "skipped")
#                                saying how to make it
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_KV_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-kv}"
reqs="$root/tests/reference/requirements.txt"
# shellcheck source=scripts/pinned-venv.sh
. "$root/scripts/pinned-venv.sh"
pinned_venv "$venv" "${1:-}" "scripts/kv-venv.sh (or set SLOPE_KV_VENV)" "the transformers KV checks need them" "$reqs"
