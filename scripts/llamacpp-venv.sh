#!/usr/bin/env bash
# Makes (once) what tests/kv/check_llamacpp.py needs, outside the repo, and prints the venv's
# python:
#   1. the pinned llama-cpp-python sdist (scripts/llamacpp-sdist.sh: PyPI, sha256-checked), which
#      vendors llama.cpp 0c1e57098;
#   2. a venv with llama-cpp-python built from that sdist (CPU only: GGML_NATIVE, no BLAS, no
#      CUDA, no multimodal library), the vendored gguf-py and sentencepiece; torch, transformers and numpy are seen
#      through a .pth pointing at the reference venv's site-packages (SLOPE_REF_VENV), as
#      scripts/bench_peer.sh does, so there is no second torch install;
#   3. f32 GGUFs of the tiny fixture checkpoints tests/reference/fixtures/{llama,gpt_oss}/model,
#      made by the vendored convert_hf_to_gguf.py with a placeholder tokenizer.
# Everything lives in $SLOPE_LLAMACPP_DIR (default ~/.cache/slope/llamacpp): venv/, models/.
#   scripts/llamacpp-venv.sh           make what is missing (PyPI; builds llama.cpp, minutes)
#   scripts/llamacpp-venv.sh --check   only look: print the python, or exit 77 (CTest's "skipped")
#                                      saying how to make it
# Environment: SLOPE_REF_VENV (a venv with torch 2.15 and transformers 5.24, see
#   tests/reference/requirements.txt; default /opt/slope-ref), JOBS (build jobs, default 2).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/llamacpp-sdist.sh
. "$root/scripts/llamacpp-sdist.sh"
dir="${SLOPE_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/slope/llamacpp}"
ref_venv="${SLOPE_REF_VENV:-/opt/slope-ref}"
jobs="${JOBS:-2}"
venv="$dir/venv"
py="$venv/bin/python"
families=(llama gpt_oss)
stamp="$venv/.slope-llamacpp-$LCP_VERSION"
log() { echo "[llamacpp-venv] $*" >&2; }

# A GGUF is current when the sha256 of the checkpoint it was made from (kept next to it) is the
# fixture's now: file times say nothing after a fresh checkout.
fixture_sum() { (cd "$root/tests/reference/fixtures/$1/model" && sha256sum config.json ./*.safetensors); }
current() { [ -f "$dir/models/$1.f32.gguf" ] && [ "$(cat "$dir/models/$1.f32.gguf.src" 2>/dev/null)" = "$(fixture_sum "$1")" ]; }
ready() {
  [ -f "$stamp" ] || return 1
  local fam
  for fam in "${families[@]}"; do current "$fam" || return 1; done
}
if ready; then echo "$py"; exit 0; fi
if [ "${1:-}" = "--check" ]; then
  echo "SKIPPED: no llama-cpp-python $LCP_VERSION venv and fixture GGUFs under $dir;" \
       "make them with SLOPE_REF_VENV=<torch venv> scripts/llamacpp-venv.sh (or set SLOPE_LLAMACPP_DIR)" >&2
  exit 77
fi

start=$(date +%s)
llamacpp_fetch_sdist "$dir" || exit 77

if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pyver='import sys; print("%d.%d" % sys.version_info[:2])'
  if [ -x "$ref_venv/bin/python" ] && [ "$("$ref_venv/bin/python" -c "$pyver")" = "$("$py" -c "$pyver")" ] \
     && "$ref_venv/bin/python" -c 'import torch, transformers, numpy' 2>/dev/null; then
    "$ref_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/zz-slope-ref.pth"
    log "torch/transformers/numpy come from $ref_venv (via $site/zz-slope-ref.pth)"
  else
    log "no reference venv at $ref_venv (set SLOPE_REF_VENV): installing torch, transformers, numpy from PyPI"
    "$venv/bin/pip" install -q --disable-pip-version-check torch transformers safetensors numpy >&2
  fi
  log "building llama-cpp-python $LCP_VERSION (vendored llama.cpp $LLAMA_COMMIT) with -j$jobs, CPU only"
  b=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$LCP_TARBALL" >&2
  log "llama-cpp-python built in $(( $(date +%s) - b )) s"
  "$venv/bin/pip" install -q --disable-pip-version-check "$LCP_LLAMA/gguf-py" 'sentencepiece>=0.1.98,<0.3.0' >&2
  "$py" -c 'import llama_cpp, gguf, numpy, torch, transformers' >&2
  touch "$stamp"
fi

mkdir -p "$dir/models" "$dir/work"
for fam in "${families[@]}"; do
  model="$root/tests/reference/fixtures/$fam/model"
  out="$dir/models/$fam.f32.gguf"
  if ! current "$fam"; then
    log "converting $model -> $out (f32)"
    llamacpp_convert "$py" "$model" "$dir/work/$fam-hf" f32 "$out.tmp" >"$dir/work/$fam.convert.log" 2>&1 \
      || { tail -30 "$dir/work/$fam.convert.log" >&2; rm -f "$out.tmp"; exit 1; }
    mv "$out.tmp" "$out"
    fixture_sum "$fam" >"$out.src"
  fi
done
log "ready in $(( $(date +%s) - start )) s: $py"
echo "$py"
