#!/usr/bin/env bash
# Peer benchmark: prefill of a SLOPE `bench` model in llama.cpp (llama-bench), for the side-by-side
# comparison in docs/performance.md.
#
# Nothing from llama.cpp lives in this repository. At run time the script
#   1. downloads the pinned llama-cpp-python source distribution from PyPI (it vendors llama.cpp
#      under vendor/llama.cpp) into a cache directory outside the repo, and checks its sha256;
#   2. builds llama-bench from that vendored source (CMake Release, GGML_NATIVE=ON, CPU only);
#   3. makes a Python venv for the vendored convert_hf_to_gguf.py (see "Python" below);
#   4. takes a SLOPE-generated HF model (`slope make-model ... --preset bench`), adds a placeholder
#      tokenizer (scripts/make_dummy_tokenizer.py) in a staging directory of symlinks, and converts
#      it to GGUF (bf16 and/or f32) with the vendored converter;
#   5. runs llama-bench: prompt processing only (-n 0), -t 2, flash attention off and on.
#
# Usage: scripts/bench_peer.sh [options] [-- extra llama-bench args]
#   --model DIR        SLOPE HF model directory (default: make one with `slope make-model`)
#   --arch A           llama | gpt-oss: model to make when --model is absent (default llama)
#   --slope BIN        slope binary for make-model (default $SLOPE_BIN, build/release/slope, build/peer/slope)
#   --outtype LIST     GGUF weight types, comma-separated from bf16,f32,f16 (default bf16)
#   -p LIST            prompt lengths (default 1024,4096)
#   --fa LIST          flash attention settings (default 0,1)
#   -r N               repetitions per test (default 3; llama-bench prints mean ± sd)
#   -t N               threads (default 2)
#   -o FMT             llama-bench output: md, csv, json, jsonl (default md)
#   --build-only       fetch and build llama-bench, make the venv, then stop
#   --with-test-backend-ops   also build test-backend-ops (kernel-level peer numbers)
# Environment: SLOPE_PEER_DIR (cache, default /opt/peer), SLOPE_REF_VENV (a venv with torch and
#   transformers, default /opt/slope-ref, see tests/reference/requirements.txt), JOBS (default 2).
#
# Python: the vendored convert_hf_to_gguf.py imports torch and transformers at top level and
#   sentencepiece unconditionally on its Llama vocabulary path. The peer venv gets the vendored
#   gguf-py and sentencepiece from PyPI, and sees torch/transformers/tokenizers/numpy/safetensors
#   through a .pth file pointing at SLOPE_REF_VENV's site-packages (the project's reference venv,
#   so no second multi-GB torch install). Without that venv it pip-installs torch and transformers.
#
# Tokenizer: SLOPE's random models have none. make_dummy_tokenizer.py writes a Llama-style
#   (SentencePiece-like BPE, byte fallback) tokenizer.json with exactly vocab_size pieces: special,
#   byte and filler tokens with no linguistic meaning. llama-bench feeds token ids, so this changes
#   nothing timed; the vocabulary size (embedding/output shapes) comes from the checkpoint.
#   For gpt-oss the converter hard-wires the GPT-2 BPE path, which only accepts tokenizers whose
#   pre-tokenizer hash it knows; the script then runs the converter through a small wrapper that
#   switches GptOssModel.set_vocab to the same Llama-vocab path (documented in the output).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/llamacpp-sdist.sh
. "$repo/scripts/llamacpp-sdist.sh"   # LCP_VERSION, LLAMA_COMMIT, llamacpp_fetch_sdist
peer="${SLOPE_PEER_DIR:-/opt/peer}"
ref_venv="${SLOPE_REF_VENV:-/opt/slope-ref}"
jobs="${JOBS:-2}"

model="" arch=llama slope_bin="${SLOPE_BIN:-}" outtypes=bf16 prompts=1024,4096 fas=0,1 reps=3 threads=2
fmt=md build_only=0 with_tbo=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --slope) slope_bin="$2"; shift 2 ;;
    --outtype) outtypes="$2"; shift 2 ;;
    -p) prompts="$2"; shift 2 ;;
    --fa) fas="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -o) fmt="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --with-test-backend-ops) with_tbo=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_peer.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[bench_peer] $*" >&2; }

build="$peer/build-$LCP_VERSION"
venv="$peer/venv"
mkdir -p "$peer/models" "$peer/work"

# 1. Source distribution ------------------------------------------------------------------------
llamacpp_fetch_sdist "$peer"
llama="$LCP_LLAMA"

# 2. Build llama-bench ---------------------------------------------------------------------------
targets=(llama-bench)
[ "$with_tbo" = 1 ] && targets+=(test-backend-ops)
need_build=0
for t in "${targets[@]}"; do [ -x "$build/bin/$t" ] || need_build=1; done
if [ "$need_build" = 1 ]; then
  log "building ${targets[*]} from vendored llama.cpp ($LLAMA_COMMIT) with -j$jobs (takes a while on 2 cores)"
  start=$(date +%s)
  cmake -S "$llama" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS="$([ "$with_tbo" = 1 ] && echo ON || echo OFF)" \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" >"$peer/cmake-configure.log" 2>&1 \
    || { cat "$peer/cmake-configure.log" >&2; exit 1; }
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" >&2
  log "build took $(( $(date +%s) - start )) s"
fi
bench="$build/bin/llama-bench"

# 3. Python venv for the converter -------------------------------------------------------------
if [ ! -f "$venv/.slope-peer-ready" ]; then
  log "creating converter venv $venv"
  python3 -m venv "$venv"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pyver='import sys; print("%d.%d" % sys.version_info[:2])'
  if [ -x "$ref_venv/bin/python" ] && [ "$("$ref_venv/bin/python" -c "$pyver")" = "$("$venv/bin/python" -c "$pyver")" ] \
     && "$ref_venv/bin/python" -c 'import torch, transformers, tokenizers' 2>/dev/null; then
    "$ref_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/zz-slope-ref.pth"
    log "torch/transformers come from $ref_venv (via $site/zz-slope-ref.pth)"
  else
    log "no reference venv at $ref_venv: installing torch and transformers from PyPI (large download)"
    "$venv/bin/pip" install -q torch transformers tokenizers safetensors numpy >&2
  fi
  "$venv/bin/pip" install -q "$llama/gguf-py" 'sentencepiece>=0.1.98,<0.3.0' >&2
  touch "$venv/.slope-peer-ready"
fi
py="$venv/bin/python"

if [ "$build_only" = 1 ]; then "$bench" --help | head -3 >&2 || true; log "built: $bench"; exit 0; fi

# 4. Model -------------------------------------------------------------------------------------
if [ -z "$model" ]; then
  if [ -z "$slope_bin" ]; then
    for c in "$repo/build/release/slope" "$repo/build/peer/slope"; do [ -x "$c" ] && { slope_bin="$c"; break; }; done
  fi
  [ -n "$slope_bin" ] && [ -x "$slope_bin" ] \
    || { echo "bench_peer.sh: no slope binary; build it (scripts/build.sh) or pass --model DIR / --slope BIN" >&2; exit 1; }
  model="$peer/models/$arch-bench-bf16"
  if [ ! -f "$model/config.json" ]; then
    log "making model: $slope_bin make-model --arch $arch --preset bench --seed 0 --out $model --dtype bf16"
    "$slope_bin" make-model --arch "$arch" --preset bench --seed 0 --out "$model" --dtype bf16 >&2
  fi
fi
model="$(cd "$model" && pwd)"
[ -f "$model/config.json" ] || { echo "bench_peer.sh: $model has no config.json" >&2; exit 1; }
hf_arch="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["architectures"][0])' "$model/config.json")"
name="$(basename "$model")"

# 5. Convert (placeholder tokenizer and the gpt-oss vocab switch: see scripts/llamacpp-sdist.sh) ----
ggufs=()
for ot in ${outtypes//,/ }; do
  out="$peer/work/$name.$ot.gguf"
  newest="$(ls -t "$model"/*.safetensors "$model/config.json" | head -1)"
  if [ ! -f "$out" ] || [ "$newest" -nt "$out" ]; then
    log "converting $model -> $out ($ot)"
    [ "$hf_arch" = GptOssForCausalLM ] && \
      log "gpt-oss: the converter's GPT-2 vocab path rejects the placeholder tokenizer; using its Llama-vocab path"
    start=$(date +%s)
    llamacpp_convert "$py" "$model" "$peer/work/$name-hf" "$ot" "$out.tmp" >"$peer/work/$name.$ot.convert.log" 2>&1 \
      || { tail -30 "$peer/work/$name.$ot.convert.log" >&2; rm -f "$out.tmp"; exit 1; }
    mv "$out.tmp" "$out"
    log "converted in $(( $(date +%s) - start )) s"
  fi
  ggufs+=(-m "$out")
done

# 6. Benchmark -------------------------------------------------------------------------------------
cmd=("$bench" "${ggufs[@]}" -p "$prompts" -n 0 -fa "$fas" -r "$reps" -t "$threads" -o "$fmt" "${extra[@]}")
echo "# llama.cpp peer: llama-cpp-python $LCP_VERSION sdist, vendored llama.cpp $LLAMA_COMMIT"
echo "# model: $model ($hf_arch), GGUF: ${outtypes}; $(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# command: ${cmd[*]}"
"${cmd[@]}"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
