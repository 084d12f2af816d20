#!/usr/bin/env bash
# The device check of the CUDA backend, in two halves, because the GPU machine has CUDA, nvcc
# and PyTorch but none of Debian's packages (no oneDNN, MPI or GoogleTest to build against) and
# no network:
#
#   scripts/gpu-check.sh pack   HERE: build the `cuda` preset, and copy the GPU test binaries
#                               and the shared libraries they need that the GPU machine lacks
#                               into .gpu-check/ (under 64 MiB; the binaries' RUNPATH has
#                               $ORIGIN). cuBLAS and NCCL are not carried: they are there.
#   scripts/gpu-check.sh run    THERE, from the repository root, with .gpu-check carried:
#                               run every GPU test against the CPU kernels on that machine's
#                               CPUs, time the kernels (bench_gpu: copy and cuBLAS ceilings,
#                               attention at 32K, the grouped MXFP4 GEMM) and PyTorch's SDPA
#                               flash attention at the same shape, and print a summary. About
#                               a minute of device time.
#
# The device call (the `run` tool), after `pack` here:
#   command: bash scripts/gpu-check.sh run     carry: [".gpu-check"]     timeout_s: 300
# Its output ends with the summary; the full logs come back under $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=.gpu-check

pack() {
  set -e
  [ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda
  cmake --build build/cuda -j2 --target slope  # slope run --device cuda
  rm -rf "$dir" && mkdir -p "$dir"
  cp build/cuda/tests/gpu/test_gpu build/cuda/tests/gpu/test_nccl build/cuda/tests/gpu/bench_gpu build/cuda/slope "$dir"/
  # The whole engine on the GPU: the tiny gpt-oss and llama fixtures (under 1 MB each).
  cp -r tests/reference/fixtures/gpt_oss/model "$dir/model-gpt-oss"
  cp -r tests/reference/fixtures/llama/model "$dir/model-llama"
  # Every resolved dependency except the C runtime (there, and newer) and CUDA's own libraries
  # (there, matching its driver).
  for bin in "$dir"/test_gpu "$dir"/test_nccl "$dir"/bench_gpu "$dir"/slope; do
    ldd "$bin" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      libcublas*|libcudart*|libnccl*|libcuda.so*) ;;
      *) cp -L "$lib" "$dir/$(basename "$lib")" ;;
    esac
  done
  git rev-parse --short HEAD >"$dir/COMMIT" 2>/dev/null || true
  local size
  size=$(du -sb "$dir" | cut -f1)
  echo "gpu-check pack: $(ls "$dir" | wc -l) files, $((size / 1048576)) MiB in $dir (carry limit 64 MiB with the tree)"
  [ "$size" -lt $((56 * 1048576)) ] || { echo "gpu-check pack: $dir is too large to carry" >&2; exit 1; }
}

# The first folder holding `name` among CUDA's library folders and the pip-installed NVIDIA
# wheels (PyTorch's cuBLAS and NCCL).
find_lib_dir() {
  local name=$1 d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$name" ] && { echo "$d"; return; }
  done
  python3 - "$name" <<'PY' 2>/dev/null
import glob, os, site, sys
for sp in site.getsitepackages():
    for hit in glob.glob(os.path.join(sp, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(hit)); sys.exit(0)
PY
}

run() {
  [ -x "$dir/test_gpu" ] || { echo "gpu-check run: $dir/test_gpu missing: run 'scripts/gpu-check.sh pack' here and carry $dir" >&2; exit 2; }
  local out=${OUT:-/tmp/gpu-check}
  mkdir -p "$out"
  local libs="$dir"
  for name in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    local d
    d=$(find_lib_dir "$name")
    if [ -n "$d" ]; then libs="$libs:$d"; else echo "gpu-check run: $name not found on this machine"; fi
  done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
  echo "commit $(cat "$dir/COMMIT" 2>/dev/null || echo unknown), nproc $(nproc)"

  echo "== test_gpu (kernels against the CPU kernels)"
  timeout 240 "$dir/test_gpu" --gtest_output="xml:$out/test_gpu.xml" >"$out/test_gpu.log" 2>&1
  local rc_gpu=$?
  grep -E '^\[  (FAILED|SKIPPED) |^\[==========\]|^\[  PASSED  \]' "$out/test_gpu.log" | head -60
  [ $rc_gpu -eq 0 ] || { echo "-- failures in full:"; grep -B2 -A12 'Failure' "$out/test_gpu.log" | head -150; }

  echo "== test_nccl (one rank, bootstrapped without MPI: the GPU machine has no MPI runtime)"
  SLOPE_TEST_NO_MPI=1 timeout 120 "$dir/test_nccl" >"$out/test_nccl.log" 2>&1
  local rc_nccl=$?
  grep -E '^\[  (FAILED|SKIPPED) |^\[==========\]|^\[  PASSED  \]|error' "$out/test_nccl.log" | head -20

  echo "== the engine on the GPU (slope run --device cuda --check: one rank, against the CPU engine)"
  local rc_engine=0
  for m in gpt-oss llama; do
    timeout 120 "$dir/slope" run --model "$dir/model-$m" --random-tokens 300 --seed 1 --dtype bf16 --device cuda \
      --threads 4 --check 2>&1 | tee "$out/engine-$m.log" | tail -4
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc_engine=1
  done

  echo "== kernel timings (bench_gpu; medians of 10, CUDA events)"
  timeout 180 "$dir/bench_gpu" 2>&1 | tee "$out/bench_gpu.log"
  local rc_bench=${PIPESTATUS[0]}

  echo "== PyTorch SDPA flash attention, the same shape (32K causal, 64 heads, D 64, bf16)"
  timeout 120 python3 - <<'PY' 2>&1 | tee "$out/sdpa.log"
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
n, Hq, Hkv, D = 32768, 64, 8, 64
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, Hq, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(1, Hkv, n, D, device="cuda", dtype=torch.bfloat16, generator=g).repeat_interleave(Hq // Hkv, 1)
v = torch.randn(1, Hkv, n, D, device="cuda", dtype=torch.bfloat16, generator=g).repeat_interleave(Hq // Hkv, 1)
def run():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
for _ in range(2): run()
torch.cuda.synchronize()
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); run(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
ts.sort(); ms = 0.5 * (ts[4] + ts[5])
flops = 4.0 * D * Hq * n * (n + 1) / 2
print(f"torch {torch.__version__} SDPA flash, 32K causal, 64 heads, D 64: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")
PY

  echo "== summary"
  if grep -q 'no CUDA device' "$out/test_gpu.log"; then
    echo "test_gpu: FAIL: the tests found no usable GPU ($(grep -m1 -o 'no CUDA device: .*' "$out/test_gpu.log"))"
    rc_gpu=3
  fi
  echo "test_gpu:  $([ $rc_gpu -eq 0 ] && echo PASS || echo "FAIL (rc $rc_gpu)")  $(grep -c '^\[       OK \]' "$out/test_gpu.log") ok, $(grep -c '^\[  SKIPPED \]' "$out/test_gpu.log") skip lines"
  echo "test_nccl: $([ $rc_nccl -eq 0 ] && echo PASS || echo "FAIL (rc $rc_nccl)")"
  echo "engine:    $([ $rc_engine -eq 0 ] && echo PASS || echo FAIL)"
  echo "bench_gpu: $([ "$rc_bench" -eq 0 ] && echo ran || echo "FAIL (rc $rc_bench)")"
  grep -E 'TFLOP|GB/s' "$out/bench_gpu.log" "$out/sdpa.log" 2>/dev/null | sed 's/^[^:]*://' 
  [ $rc_gpu -eq 0 ] && [ $rc_nccl -eq 0 ] && [ $rc_engine -eq 0 ]
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh pack|run (pack here, run on the GPU machine; see the header)" >&2; exit 2 ;;
esac
