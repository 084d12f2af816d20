// RoPE: for each row at position p and each i < D/2, a = p·inv_freq_i in double (so positions
// near 1M keep f32 accuracy, as on the CPU), c = cos(a)·scaling and s = sin(a)·scaling rounded to
// f32, then for every head x1' = x1·c − x2·s, x2' = x2·c + x1·s with x1 = x[i], x2 = x[i + D/2].
// One thread per (row, i), looping over the heads, so each angle is computed once per row.
#include "slope/cuda/rope.h"

#include <cuda_bf16.h>

#include <vector>

#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float load(const T* p) {
  if constexpr (sizeof(T) == 4) return *p;
  else return __bfloat162float(*p);
}
template <typename T>
__device__ __forceinline__ void store(T* p, float v) {
  if constexpr (sizeof(T) == 4) *p = v;
  else *p = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void rope_kernel(T* x, int64_t n, int64_t H, int64_t D, const double* inv_freq, double scaling,
                            int64_t pos0, const int64_t* pos) {
  const int64_t half = D / 2;
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= n * half) return;
  const int64_t r = idx / half, i = idx % half;
  const double p = pos ? double(pos[r]) : double(pos0 + r);
  double sn, cs;
  sincos(p * inv_freq[i], &sn, &cs);
  const float c = float(cs * scaling), s = float(sn * scaling);
  T* row = x + r * H * D;
  for (int64_t h = 0; h < H; ++h) {
    T* x1 = row + h * D + i;
    T* x2 = x1 + half;
    const float a = load(x1), b = load(x2);
    store(x1, a * c - b * s);
    store(x2, b * c + a * s);
  }
}

}  // namespace

Rope::Rope(const kernels::RopeConfig& cfg) : Rope(kernels::Rope(cfg)) {}

Rope::Rope(const kernels::Rope& host) {
  head_dim_ = host.head_dim();
  attention_scaling_ = host.attention_scaling();
  inv_freq_ = DeviceBuffer::from(host.inv_freq());
}

template <typename T>
static void launch(T* x, int64_t n, int64_t H, int64_t D, const double* inv_freq, double scaling, int64_t pos0,
                   const int64_t* pos, cudaStream_t s) {
  SLOPE_CHECK(D > 0, "cuda::Rope::apply on a Rope built without a config");
  if (n <= 0 || H <= 0) return;
  SLOPE_CHECK(x, "cuda::Rope::apply: null device pointer");
  const int64_t work = n * (D / 2);
  rope_kernel<<<unsigned((work + kThreads - 1) / kThreads), kThreads, 0, s>>>(x, n, H, D, inv_freq, scaling, pos0,
                                                                              pos);
  SLOPE_CUDA_CHECK_LAUNCH("rope_kernel");
}

void Rope::apply(float* x, int64_t n, int64_t H, int64_t pos0, Stream stream) const {
  launch(x, n, H, head_dim_, inv_freq_.as<double>(), attention_scaling_, pos0, nullptr, stream);
}

void Rope::apply(float* x, int64_t n, int64_t H, const int64_t* pos, Stream stream) const {
  SLOPE_CHECK(pos || n <= 0, "cuda::Rope::apply: null positions");
  launch(x, n, H, head_dim_, inv_freq_.as<double>(), attention_scaling_, 0, pos, stream);
}

void Rope::apply_bf16(uint16_t* x, int64_t n, int64_t H, int64_t pos0, Stream stream) const {
  launch(reinterpret_cast<__nv_bfloat16*>(x), n, H, head_dim_, inv_freq_.as<double>(), attention_scaling_, pos0,
         nullptr, stream);
}

}  // namespace slope::cuda
