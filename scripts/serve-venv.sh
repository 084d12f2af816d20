#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo with the pinned PyPI `openai` and `prometheus_client`
# that the serve tests (tests/serve/) and scripts/serve_demo.sh drive `slope serve` with, and prints
# its python. The venv is $SLOPE_SERVE_VENV, by default ~/.cache/slope/venv-serve. Exits 77
# (CTest's "skipped") when PyPI cannot be reached.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_SERVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-serve}"
req="$root/scripts/serve_requirements.txt"
py="$venv/bin/python"
want="$(grep -E '^[a-z_]+==' "$req" | sort | tr '\n' ' ')"
have() { "$py" -m pip freeze --disable-pip-version-check 2>/dev/null | tr 'A-Z-' 'a-z_' | grep -E '^(openai|prometheus_client)==' | sort | tr '\n' ' '; }
if [ -x "$py" ] && [ "$(have)" = "$want" ]; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2; then
  echo "SKIPPED: cannot install $want from PyPI into $venv (offline?); the serve tests need them" >&2
  exit 77
fi
echo "$py"
