#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo with what the serving tools and tests need, and
# prints its python: scripts/serve_requirements.txt (the pinned `openai` and `prometheus_client`
# that tests/serve/test_serve.py and scripts/serve_demo.sh drive `slope serve` with) and
# scripts/bench_serve_requirements.txt (aiohttp, for scripts/bench_serve.py). The venv is
# $SLOPE_SERVE_VENV, by default ~/.cache/slope/venv-serve.
#   scripts/serve-venv.sh           make it if needed (PyPI); exits 77 when PyPI cannot be reached
#   scripts/serve-venv.sh --check   only look: print its python, or exit 77 (CTest's "skipped")
#                                   saying how to make it
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_SERVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-serve}"
reqs=("$root/scripts/serve_requirements.txt" "$root/scripts/bench_serve_requirements.txt")
py="$venv/bin/python"
# "name==version" of every pin, normalised as pip freeze spells them, sorted.
want="$(cat "${reqs[@]}" | grep -E '^[A-Za-z0-9_.-]+==' | tr 'A-Z-' 'a-z_' | sort | tr '\n' ' ')"
have() {
  local names
  names="$(echo "$want" | tr ' ' '\n' | cut -d= -f1 | grep -v '^$' | paste -sd'|')"
  "$py" -m pip freeze --disable-pip-version-check 2>/dev/null | tr 'A-Z-' 'a-z_' | grep -E "^($names)==" | sort | tr '\n' ' '
}
if [ -x "$py" ] && [ "$(have)" = "$want" ]; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "SKIPPED: no venv with $want at $venv; make it with scripts/serve-venv.sh (or set SLOPE_SERVE_VENV)" >&2
  exit 77
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "${reqs[0]}" -r "${reqs[1]}" >&2; then
  echo "SKIPPED: cannot install $want from PyPI into $venv (offline?); the serve tests and tools need them" >&2
  exit 77
fi
echo "$py"
