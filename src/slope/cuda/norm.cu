// RMSNorm: y = w · x / sqrt(mean(x²) + eps) in f32 (kernels/norm.h). One block per row; Σx² is
// a block reduction (warp shuffles, then one value per warp), so its summation order differs
// from the CPU's 16-lane sum by rounding only. Each thread writes the elements it read, so y
// may alias x.
#include "slope/cuda/norm.h"

#include <cuda_bf16.h>

#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) s += part[i];
  return s;
}

// kMode: 0 = f32 activations, 1 = bf16 WeightThenCast, 2 = bf16 CastThenWeight.
template <int kMode, typename Out>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const float* x, const float* w, Out* y, int64_t dim,
                                                           float eps) {
  const float* xr = x + int64_t(blockIdx.x) * dim;
  Out* yr = y + int64_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  const float r = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = xr[i] * r;
    float out;
    if constexpr (kMode == 0) out = w[i] * v;
    else if constexpr (kMode == 1) out = round_bf16(w[i] * v);   // (w · y).to(bf16)
    else out = round_bf16(w[i] * round_bf16(v));                 // w · y.to(bf16), product in bf16
    if constexpr (sizeof(Out) == 4) yr[i] = out;
    else yr[i] = __float2bfloat16_rn(out);
  }
}

template <typename Out>
void launch(const float* x, const float* w, Out* y, int64_t rows, int64_t dim, float eps, int mode,
            cudaStream_t s) {
  SLOPE_CHECK(dim > 0, "cuda::rmsnorm: dim must be positive, got ", dim);
  SLOPE_CHECK(rows <= 0x7fffffff, "cuda::rmsnorm: ", rows, " rows are over the grid limit");
  if (rows <= 0) return;
  SLOPE_CHECK(x && w && y, "cuda::rmsnorm: null device pointer");
  const unsigned grid = unsigned(rows);
  if (mode == 0) rmsnorm_kernel<0><<<grid, kThreads, 0, s>>>(x, w, y, dim, eps);
  else if (mode == 1) rmsnorm_kernel<1><<<grid, kThreads, 0, s>>>(x, w, y, dim, eps);
  else rmsnorm_kernel<2><<<grid, kThreads, 0, s>>>(x, w, y, dim, eps);
  SLOPE_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

int mode_of(kernels::NormOrder order, DType act) {
  SLOPE_CHECK(act == DType::F32 || act == DType::BF16, "cuda::rmsnorm: activation dtype ", dtype_name(act),
              " is not supported (F32, BF16)");
  if (act == DType::F32) return 0;
  return order == kernels::NormOrder::WeightThenCast ? 1 : 2;
}

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             kernels::NormOrder order, DType act_dtype, Stream stream) {
  launch(x, w, y, rows, dim, eps, mode_of(order, act_dtype), stream);
}

void rmsnorm_to_bf16(const float* x, const float* w, uint16_t* y, int64_t rows, int64_t dim, float eps,
                     kernels::NormOrder order, Stream stream) {
  launch(x, w, reinterpret_cast<__nv_bfloat16*>(y), rows, dim, eps, mode_of(order, DType::BF16), stream);
}

}  // namespace slope::cuda
