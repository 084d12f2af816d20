#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo with what scripts/bench_serve.py needs
# (scripts/bench_serve_requirements.txt: aiohttp), and prints its python. The venv is
# $SLOPE_SERVE_VENV, by default ~/.cache/slope/venv-serve.
#   scripts/serve-venv.sh           make it if needed (PyPI); exits 77 when PyPI cannot be reached
#   scripts/serve-venv.sh --check   only look: print its python, or exit 77 (CTest's "skipped")
#                                   saying how to make it
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_SERVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-serve}"
req="$root/scripts/bench_serve_requirements.txt"
want="$(grep -E '^aiohttp==' "$req" | cut -d= -f3)"
py="$venv/bin/python"
if [ -x "$py" ] && [ "$("$py" -c 'import aiohttp; print(aiohttp.__version__)' 2>/dev/null)" = "$want" ]; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "SKIPPED: no venv with aiohttp==$want at $venv; make it with scripts/serve-venv.sh (or set SLOPE_SERVE_VENV)" >&2
  exit 77
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2; then
  echo "SKIPPED: cannot install aiohttp==$want from PyPI into $venv (offline?); scripts/bench_serve.py needs it" >&2
  exit 77
fi
echo "$py"
