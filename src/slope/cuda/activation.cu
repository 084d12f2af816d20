// Element-wise SwiGLU variants (kernels/moe.h); one thread per output element, f32 throughout,
// sigmoid(z) = 1 / (1 + e^{−z}) with expf (the CPU's vector exp is a ~1-ulp polynomial).
#include "slope/cuda/activation.h"

#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void swiglu_oai_kernel(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= m * I) return;
  const int64_t r = idx / I, i = idx % I;
  const float gate = fminf(gu[r * 2 * I + 2 * i], limit);
  const float up = fminf(fmaxf(gu[r * 2 * I + 2 * i + 1], -limit), limit);
  out[idx] = (up + 1.0f) * (gate / (1.0f + expf(-gate * alpha)));
}

__global__ void silu_mul_kernel(const float* gate_up, int64_t m, int64_t I, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= m * I) return;
  const int64_t r = idx / I, i = idx % I;
  const float g = gate_up[r * 2 * I + i], u = gate_up[r * 2 * I + I + i];
  out[idx] = g / (1.0f + expf(-g)) * u;
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out, Stream stream) {
  if (m <= 0 || I <= 0) return;
  SLOPE_CHECK(gu && out, "cuda::swiglu_oai: null device pointer");
  swiglu_oai_kernel<<<blocks_for(m * I), kThreads, 0, stream>>>(gu, m, I, alpha, limit, out);
  SLOPE_CUDA_CHECK_LAUNCH("swiglu_oai_kernel");
}

void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out, Stream stream) {
  if (m <= 0 || I <= 0) return;
  SLOPE_CHECK(gate_up && out, "cuda::silu_mul: null device pointer");
  silu_mul_kernel<<<blocks_for(m * I), kThreads, 0, stream>>>(gate_up, m, I, out);
  SLOPE_CUDA_CHECK_LAUNCH("silu_mul_kernel");
}

}  // namespace slope::cuda
