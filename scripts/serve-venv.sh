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
# shellcheck source=scripts/pinned-venv.sh
. "$root/scripts/pinned-venv.sh"
pinned_venv "$venv" "${1:-}" "scripts/serve-venv.sh (or set SLOPE_SERVE_VENV)" "the serve tests and tools need them" "${reqs[@]}"
