#!/usr/bin/env bash
# Runs a tests/kv/check_vllm*.py script under the vLLM venv (scripts/vllm-venv.sh); exits 77,
# CTest's "skipped", when that venv has not been made.
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$("$root/scripts/vllm-venv.sh" --check)" || exit 77
exec "$py" "$@"
