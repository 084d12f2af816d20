#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "slope/cuda/check.cuh"
#include "slope/cuda/ops_kernels.h"

namespace slope::cuda {
namespace {

constexpr int kThreads = 256;
int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

__global__ void fill_kernel(float* x, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}
__global__ void nonfinite_kernel(const float* x, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(x[i])) *flag = 1;  // racy writes of the same value: fine
}
// One block per row.
__global__ void gather_kernel(const float* src, const int64_t* rows, int64_t dim, float* dst) {
  const float* s = src + rows[blockIdx.x] * dim;
  float* d = dst + int64_t(blockIdx.x) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) d[j] = s[j];
}
// Serial over rows within one launch (rows may repeat, as the CPU contract allows): one block,
// threads over the columns, rows in order, so no two threads add to the same element at once.
__global__ void scatter_add_kernel(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim,
                                   float* dst) {
  for (int64_t r = 0; r < m; ++r) {
    float* d = dst + rows[r] * dim;
    const float* s = src + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) d[j] += w[r] * s[j];
    __syncthreads();
  }
}
__global__ void widen_kernel(const int32_t* src, int64_t n, int64_t* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
template <typename T>
__device__ float to_f32(T x);
template <>
__device__ float to_f32(float x) { return x; }
template <>
__device__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ float to_f32(__half x) { return __half2float(x); }
template <typename T>
__global__ void embed_kernel(const T* table, int64_t width, const int32_t* ids, float* out) {
  const T* row = table + int64_t(ids[blockIdx.x]) * width;
  float* o = out + int64_t(blockIdx.x) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) o[j] = to_f32(row[j]);
}

}  // namespace

void fill(float* x, int64_t n, float value, Stream stream) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, value);
  SLOPE_CUDA_CHECK_LAUNCH("fill");
}
void add_inplace(float* y, const float* x, int64_t n, Stream stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  SLOPE_CUDA_CHECK_LAUNCH("add_inplace");
}
void flag_nonfinite(const float* x, int64_t n, int* flag, Stream stream) {
  if (n <= 0) return;
  nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, flag);
  SLOPE_CUDA_CHECK_LAUNCH("flag_nonfinite");
}
void gather_rows_i64(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst, Stream stream) {
  if (m <= 0) return;
  SLOPE_CHECK(m <= INT32_MAX, "gather_rows: ", m, " rows is more than one launch takes");
  gather_kernel<<<unsigned(m), kThreads, 0, stream>>>(src, rows, dim, dst);
  SLOPE_CUDA_CHECK_LAUNCH("gather_rows");
}
void scatter_add_rows_i64(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim, float* dst,
                          Stream stream) {
  if (m <= 0) return;
  scatter_add_kernel<<<1, 1024, 0, stream>>>(src, rows, w, m, dim, dst);
  SLOPE_CUDA_CHECK_LAUNCH("scatter_add_rows");
}
void widen_i32(const int32_t* src, int64_t n, int64_t* dst, Stream stream) {
  if (n <= 0) return;
  widen_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
  SLOPE_CUDA_CHECK_LAUNCH("widen_i32");
}
void embed(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n, float* out, Stream stream) {
  if (n <= 0) return;
  SLOPE_CHECK(n <= INT32_MAX, "embed: ", n, " tokens is more than one launch takes");
  switch (dtype) {
    case DType::F32: embed_kernel<<<unsigned(n), kThreads, 0, stream>>>(static_cast<const float*>(table), width, ids, out); break;
    case DType::BF16:
      embed_kernel<<<unsigned(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), width, ids, out);
      break;
    case DType::F16: embed_kernel<<<unsigned(n), kThreads, 0, stream>>>(static_cast<const __half*>(table), width, ids, out); break;
    default: fail("embed: a table of dtype ", dtype_name(dtype), " is not supported");
  }
  SLOPE_CUDA_CHECK_LAUNCH("embed");
}

}  // namespace slope::cuda
