#!/usr/bin/env bash
# Makes (once) a Python venv outside the repo with the pinned PyPI `tokenizers` and `jinja2` the
# tokenizer and chat tests compare against, and prints its python. The venv is $SLOPE_TOKENIZERS_VENV, by default
# ~/.cache/slope/venv-tokenizers. Exits 77 (CTest's "skipped") when PyPI cannot be reached.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SLOPE_TOKENIZERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/venv-tokenizers}"
req="$root/tests/text/requirements.txt"
want="$(grep -E '^tokenizers==' "$req" | cut -d= -f3)"
py="$venv/bin/python"
want_jinja="$(grep -E '^jinja2==' "$req" | cut -d= -f3)"
if [ -x "$py" ] && [ "$("$py" -c 'import tokenizers, jinja2; print(tokenizers.__version__, jinja2.__version__)' 2>/dev/null)" = "$want $want_jinja" ]; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2
if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2; then
  echo "SKIPPED: cannot install tokenizers==$want and jinja2==$want_jinja from PyPI into $venv (offline?); the tokenizer and chat tests need them" >&2
  exit 77
fi
echo "$py"
