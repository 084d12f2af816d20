# Sourced by the scripts that make a test or tool venv outside the repo (serve-venv.sh,
# kv-venv.sh). pinned_venv VENV MODE HOW NEEDS REQ...: prints VENV's python when it holds exactly
# the pins (name==version lines) of the REQ files, compared as pip freeze spells them, a local
# version such as +cu132 ignored. Otherwise, with MODE --check, it exits 77 (CTest's "skipped")
# saying HOW to make it; with any other MODE it makes the venv from PyPI, exiting 77 when PyPI
# cannot be reached (NEEDS says what needs the packages).
pinned_venv() {
  local venv=$1 mode=$2 how=$3 needs=$4
  shift 4
  local py="$venv/bin/python" want names have req args=()
  want="$(cat "$@" | grep -E '^[A-Za-z0-9_.-]+==' | tr 'A-Z-' 'a-z_' | sed 's/+[^ ]*$//' | sort | tr '\n' ' ')"
  names="$(echo "$want" | tr ' ' '\n' | cut -d= -f1 | grep -v '^$' | paste -sd'|')"
  if [ -x "$py" ]; then
    have="$("$py" -m pip freeze --disable-pip-version-check 2>/dev/null | tr 'A-Z-' 'a-z_' | sed 's/+.*//' |
      grep -E "^($names)==" | sort | tr '\n' ' ')" || true
    if [ "$have" = "$want" ]; then
      echo "$py"
      exit 0
    fi
  fi
  if [ "$mode" = "--check" ]; then
    echo "SKIPPED: no venv with $want at $venv; make it with $how" >&2
    exit 77
  fi
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
  for req in "$@"; do args+=(-r "$req"); done
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${args[@]}" >&2; then
    echo "SKIPPED: cannot install $want from PyPI into $venv (offline?); $needs" >&2
    exit 77
  fi
  echo "$py"
  exit 0
}
