# Sourced (not run) by scripts/bench_peer.sh and scripts/llamacpp-venv.sh: the pinned
# llama-cpp-python source distribution, which vendors llama.cpp under vendor/llama.cpp.
# Nothing of llama.cpp is committed to this repository; it is fetched from PyPI at run time and
# checked against its sha256.
#
#   llamacpp_fetch_sdist DIR   downloads (once) the sdist into DIR/dl, verifies it and unpacks it
#                              into DIR/src; sets LCP_SRC (the sdist tree) and LCP_LLAMA
#                              (its vendored llama.cpp) and LCP_TARBALL.

LCP_VERSION=0.3.36   # llama-cpp-python sdist; vendors ggml-org/llama.cpp@0c1e57098
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_COMMIT=0c1e57098

llamacpp_fetch_sdist() {
  local dir="$1"
  LCP_TARBALL="$dir/dl/llama_cpp_python-$LCP_VERSION.tar.gz"
  LCP_SRC="$dir/src/llama_cpp_python-$LCP_VERSION"
  LCP_LLAMA="$LCP_SRC/vendor/llama.cpp"
  mkdir -p "$dir/dl" "$dir/src"
  if [ ! -f "$LCP_TARBALL" ]; then
    echo "downloading llama-cpp-python==$LCP_VERSION sdist from PyPI" >&2
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LCP_VERSION" -d "$dir/dl" >&2 \
      || { echo "cannot download llama-cpp-python==$LCP_VERSION from PyPI (offline?)" >&2; return 1; }
  fi
  echo "$LCP_SHA256  $LCP_TARBALL" | sha256sum -c --quiet - >&2 \
    || { echo "$LCP_TARBALL does not have the pinned sha256 $LCP_SHA256; delete it and rerun" >&2; return 1; }
  if [ ! -f "$LCP_LLAMA/CMakeLists.txt" ]; then
    tar -xzf "$LCP_TARBALL" -C "$dir/src"
  fi
}

#   llamacpp_convert PY MODEL STAGE OUTTYPE OUTFILE
#                              converts the HF checkpoint MODEL to GGUF with the vendored
#                              convert_hf_to_gguf.py run by PY (a python with torch,
#                              transformers and the vendored gguf-py), after llamacpp_fetch_sdist.
#                              STAGE is a scratch directory: symlinks to MODEL's files plus a
#                              placeholder tokenizer (scripts/make_dummy_tokenizer.py; MODEL itself
#                              is left untouched). For gpt-oss the converter hard-wires the GPT-2
#                              BPE vocab path, which only accepts pre-tokenizers whose hash it
#                              knows; it is then run through a small wrapper that switches
#                              GptOssModel.set_vocab to the Llama-vocab path of the placeholder.
llamacpp_convert() {
  local py="$1" model="$2" stage="$3" outtype="$4" outfile="$5" f hf_arch
  local here; here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  rm -rf "$stage"; mkdir -p "$stage"
  for f in "$model"/*; do
    case "$(basename "$f")" in tokenizer*|special_tokens_map.json) ;; *) ln -s "$f" "$stage/" ;; esac
  done
  "$py" "$here/make_dummy_tokenizer.py" "$stage" >&2
  hf_arch="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["architectures"][0])' "$model/config.json")"
  if [ "$hf_arch" = GptOssForCausalLM ]; then
    (cd "$LCP_LLAMA" && "$py" - "$stage" --outtype "$outtype" --outfile "$outfile" <<'PY'
import runpy, sys
sys.path.insert(0, ".")
import conversion.gpt_oss as g
g.GptOssModel.set_vocab = lambda self: self._set_vocab_llama_hf()  # placeholder vocab, see llamacpp-sdist.sh
sys.argv[0] = "convert_hf_to_gguf.py"
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
PY
    )
  else
    (cd "$LCP_LLAMA" && "$py" convert_hf_to_gguf.py "$stage" --outtype "$outtype" --outfile "$outfile")
  fi
}
