// Kernel timings on a GPU, for scripts/gpu-check.sh: the two ceilings measured in the same run
// (a device-to-device copy, a large cuBLAS bf16 GEMM), then flash attention at 32K causal
// with gpt-oss's heads (64 query, 8 KV, head_dim 64) and the grouped MXFP4 expert GEMM at
// gpt-oss-120b's gate_up shape. Each figure is the median of 10 timed runs after 2 warm-ups,
// timed with CUDA events. Exits 0 without a GPU (prints why). Not yet run on a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "slope/core/half.h"
#include "slope/cuda/attention.h"
#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"
#include "slope/cuda/gemm.h"
#include "slope/cuda/moe.h"
#include "slope/kernels/attention.h"

namespace {

using namespace slope;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median milliseconds of fn over 10 runs after 2 warm-ups.
double time_ms(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 2; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    check(cudaEventRecord(a), "record");
    fn();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "run");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[4] + ms[5]);
}

// Random bf16 bits of values in [-1, 1) (never zeros: they run faster than real data).
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = f32_to_bf16(float(int32_t(x >> 8) - (1 << 23)) / float(1 << 23));
  }
  return v;
}

}  // namespace

int main() {
  std::string why;
  if (cuda::device_count(&why) == 0) {
    std::printf("bench_gpu: no CUDA device: %s\n", why.c_str());
    return 0;
  }
  const cuda::DeviceInfo info = cuda::device_info(0);
  std::printf("device: %s, sm_%d%d, %d SMs, %.1f GiB\n", info.name.c_str(), info.major, info.minor,
              info.multiprocessors, double(info.global_memory) / (1 << 30));
  std::printf("%-52s %10s %12s\n", "kernel", "ms", "rate");

  // 1. Copy ceiling: 2 GiB device to device, bytes read + written.
  const size_t copy_bytes = size_t(2) << 30;
  double copy_gbs = 0;
  {
    cuda::DeviceBuffer src(copy_bytes), dst(copy_bytes);
    src.fill_bytes(0x5a);
    const double ms = time_ms([&] { check(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice), "copy"); });
    copy_gbs = 2.0 * double(copy_bytes) / (ms * 1e6);
    std::printf("%-52s %10.3f %9.0f GB/s\n", "device-to-device copy, 2 GiB", ms, copy_gbs);
  }

  // 2. Matrix ceiling: cuBLAS bf16 GEMM 8192³ (f32 accumulate, f32 out) through cuda::Linear.
  double peak = 0;
  {
    const int64_t n = 8192;
    const auto w = random_bf16(size_t(n * n), 1), x = random_bf16(size_t(n * n), 2);
    const cuda::Linear lin(w.data(), DType::BF16, kernels::WeightLayout::OutIn, n, n, nullptr,
                           kernels::ComputeType::BF16);
    auto dx = cuda::DeviceBuffer::from(x);
    cuda::DeviceBuffer dy(size_t(n * n) * 4);
    const double ms = time_ms([&] { lin.forward_bf16(dx.as<uint16_t>(), n, dy.as<float>()); });
    peak = 2.0 * n * n * n / (ms * 1e9);
    std::printf("%-52s %10.3f %8.1f TFLOP/s\n", "cuBLAS bf16 GEMM 8192^3 (the peak below)", ms, peak);
  }

  // 3. Flash attention, 32K causal, Hq 64, Hkv 8, D 64, bf16 inputs.
  {
    const int64_t n = 32768, Hq = 64, Hkv = 8, D = 64;
    auto dq = cuda::DeviceBuffer::from(random_bf16(size_t(n * Hq * D), 3));
    auto dk = cuda::DeviceBuffer::from(random_bf16(size_t(n * Hkv * D), 4));
    auto dv = cuda::DeviceBuffer::from(random_bf16(size_t(n * Hkv * D), 5));
    cuda::DeviceBuffer dout(size_t(n * Hq * D) * 4), dlse(size_t(n * Hq) * 4);
    for (const int64_t window : {int64_t{0}, int64_t{128}}) {
      const kernels::AttentionShape shape{Hq, Hkv, D};
      const kernels::AttentionMask mask{true, window};
      const double flops = kernels::attention_flops(n, 0, n, 0, shape, mask);
      const double ms = time_ms([&] {
        cuda::flash_attention(cuda::AttentionArgsBf16{.q = dq.as<uint16_t>(), .nq = n, .k = dk.as<uint16_t>(),
                                                      .v = dv.as<uint16_t>(), .nk = n, .shape = shape, .mask = mask,
                                                      .scale = 0.125f, .out = dout.as<float>(), .lse = dlse.as<float>()});
      });
      const double tf = flops / (ms * 1e9);
      std::printf("%-52s %10.3f %8.1f TFLOP/s (%.0f%% of the GEMM)\n",
                  window ? "attention 32K causal, window 128, 64/8 heads, D 64" : "attention 32K causal, 64/8 heads, D 64",
                  ms, tf, 100 * tf / peak);
    }
  }

  // 4. Grouped MXFP4 expert GEMM, gpt-oss-120b gate_up: 8192 tokens × top-4 of 128 experts,
  //    [5760, 2880] per expert. Weights are a constant non-zero byte pattern (filled on the
  //    device: 1 GB of random bytes from the host would dominate the run).
  {
    const int64_t tokens = 8192, E = 128, K = 2880, N = 5760;
    const int k = 4;
    std::vector<float> logits(size_t(tokens * E));
    std::mt19937 rng(6);
    std::normal_distribution<float> nd;
    for (auto& l : logits) l = nd(rng);
    auto dl = cuda::DeviceBuffer::from(logits);
    cuda::DeviceBuffer ids(size_t(tokens * k) * 4), wts(size_t(tokens * k) * 4);
    cuda::route_topk_softmax(dl.as<float>(), tokens, E, k, ids.as<int32_t>(), wts.as<float>());
    cuda::ExpertGroups g(tokens * k, E);
    cuda::group_by_expert(ids.as<int32_t>(), wts.as<float>(), tokens, k, g);
    std::vector<float> x(size_t(tokens * K));
    for (auto& v : x) v = nd(rng);
    auto dx = cuda::DeviceBuffer::from(x);
    cuda::DeviceBuffer blocks(size_t(E * N * K / 2)), scales(size_t(E * N * K / 32)), y(size_t(tokens * k * N) * 4);
    blocks.fill_bytes(0x3a);
    scales.fill_bytes(0x7f);
    const double ms = time_ms([&] {
      cuda::grouped_gemm({.a = dx.as<float>(), .a_rows = g.token(), .K = K, .offsets = g.offsets(), .E = E,
                          .rows = tokens * k, .N = N, .w_blocks = blocks.as<uint8_t>(), .w_scales = scales.as<uint8_t>(),
                          .y = y.as<float>()});
    });
    const double tf = 2.0 * tokens * k * N * K / (ms * 1e9);
    std::printf("%-52s %10.3f %8.1f TFLOP/s (%.0f%% of the GEMM)\n", "grouped MXFP4 GEMM, gpt-oss-120b gate_up, 8K tok", ms,
                tf, 100 * tf / peak);
  }
  cuda::synchronize();
  return 0;
}
