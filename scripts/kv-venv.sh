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
py="$venv/bin/python"
# "name==version" of every pin, normalised as pip freeze spells them, sorted. torch's local
# version (e.g. +cu132) is dropped on both sides: the pin is the release.
want="$(grep -E '^[A-Za-z0-9_.-]+==' "$reqs" | tr 'A-Z-' 'a-z_' | sort | tr '\n' ' ')"
have() {
  local names
  names="$(echo "$want" | tr ' ' '\n' | cut -d= -f1 | grep -v '^$' | paste -sd'|')"
  "$py" -m pip freeze --disable-pip-version-check 2>/dev/null | tr 'A-Z-' 'a-z_' | sed 's/+.*//' |
    grep -E "^($names)==" | sort | tr '\n' ' '
}
if [ -x "$py" ] && [ "$(have)" = "$want" ]; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "SKIPPED: no venv with $want at $venv; make it with scripts/kv-venv.sh (or set SLOPE_KV_VENV)" >&2
  exit 77
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs" >&2; then
  echo "SKIPPED: cannot install $want from PyPI into $venv (offline?); the transformers KV checks need them" >&2
  exit 77
fi
echo "$py"
