// cuBLAS GEMMs for the linear layers (contract: gemm.h). cuBLAS is column-major; a row-major
// [R, C] matrix is a column-major [C, R] one, so y = x·Wᵀ (row-major [M, N]) is computed as
// the column-major yᵀ [N, M] = W · xᵀ:
//   OutIn weight [N, K] row-major = column-major Kx N, i.e. Wᵀ:  op(A) = T, lda = K
//   InOut weight [K, N] row-major = column-major N x K, i.e. W:  op(A) = N, lda = N
//   x [M, K] row-major = column-major K x M = xᵀ:                 op(B) = N, ldb = K
// One cuBLAS handle per host thread (cuBLAS handles are not for concurrent use), bound to the
// caller's stream at each call.
#include "slope/cuda/gemm.h"

#include <cuda_bf16.h>

#include <vector>

#include "slope/core/half.h"
#include "slope/cuda/check.cuh"

namespace slope::cuda {
namespace {

constexpr int kThreads = 256;

struct Handle {
  cublasHandle_t h = nullptr;
  Handle() { SLOPE_CUBLAS_CHECK(cublasCreate(&h)); }
  ~Handle() { cublasDestroy(h); }
};

cublasHandle_t cublas(cudaStream_t stream) {
  thread_local Handle handle;
  SLOPE_CUBLAS_CHECK(cublasSetStream(handle.h, stream));
  return handle.h;
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// y[r, c] += bias[c] for y [M, N].
__global__ void add_bias_kernel(float* y, const float* bias, int64_t M, int64_t N) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < M * N) y[i] += bias[i % N];
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

float host_value(const void* w, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(w)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
}

}  // namespace

Linear::Linear(const void* weight, DType wdtype, kernels::WeightLayout layout, int64_t out_features,
               int64_t in_features, const float* bias, kernels::ComputeType ct)
    : layout_(layout), ct_(ct), N_(out_features), K_(in_features) {
  SLOPE_CHECK(out_features > 0 && in_features > 0, "cuda::Linear: empty weight [", out_features, ", ", in_features,
              "]");
  SLOPE_CHECK(wdtype == DType::F32 || wdtype == DType::BF16 || wdtype == DType::F16, "cuda::Linear: weight dtype ",
              dtype_name(wdtype), " is not supported (F32, BF16, F16)");
  SLOPE_CHECK(weight, "cuda::Linear: null weight");
  const int64_t n = N_ * K_;
  if (ct == kernels::ComputeType::BF16) {
    std::vector<uint16_t> w(n);
    if (wdtype == DType::BF16) {
      const auto* src = static_cast<const uint16_t*>(weight);
      w.assign(src, src + n);
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] = f32_to_bf16(host_value(weight, wdtype, i));
    }
    weight_ = DeviceBuffer::from(w);
  } else {
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = host_value(weight, wdtype, i);
    weight_ = DeviceBuffer::from(w);
  }
  if (bias) bias_ = DeviceBuffer::from(std::vector<float>(bias, bias + N_));
}

void Linear::gemm(const void* x, int64_t M, float* y, bool accumulate, Stream stream) const {
  const bool bf16 = ct_ == kernels::ComputeType::BF16;
  const bool out_in = layout_ == kernels::WeightLayout::OutIn;
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  SLOPE_CHECK(M <= 0x7fffffff && N_ <= 0x7fffffff && K_ <= 0x7fffffff, "cuda::Linear: dimensions over 2^31");
  const int m = int(N_), n = int(M), k = int(K_);
  SLOPE_CUBLAS_CHECK(cublasGemmEx(cublas(stream), out_in ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha,
                                  weight_.as<void>(), bf16 ? CUDA_R_16BF : CUDA_R_32F, out_in ? k : m, x,
                                  bf16 ? CUDA_R_16BF : CUDA_R_32F, k, &beta, y, CUDA_R_32F, m,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias_.bytes()) {
    add_bias_kernel<<<blocks_for(M * N_), kThreads, 0, stream>>>(y, bias_.as<float>(), M, N_);
    SLOPE_CUDA_CHECK_LAUNCH("add_bias_kernel");
  }
}

void Linear::forward(const float* x, int64_t M, float* y, bool accumulate, Stream stream) const {
  SLOPE_CHECK(!empty(), "cuda::Linear::forward on an empty Linear");
  SLOPE_CHECK(M >= 0, "cuda::Linear::forward: negative row count ", M);
  if (M == 0) return;
  SLOPE_CHECK(x && y, "cuda::Linear::forward: null device pointer");
  if (ct_ == kernels::ComputeType::F32) return gemm(x, M, y, accumulate, stream);
  void* xb = nullptr;
  SLOPE_CUDA_CHECK(cudaMallocAsync(&xb, size_t(M * K_) * 2, stream));
  to_bf16(x, static_cast<uint16_t*>(xb), M * K_, stream);
  try {
    gemm(xb, M, y, accumulate, stream);
  } catch (...) {
    cudaFreeAsync(xb, stream);
    throw;
  }
  SLOPE_CUDA_CHECK(cudaFreeAsync(xb, stream));
}

void Linear::forward_bf16(const uint16_t* x, int64_t M, float* y, bool accumulate, Stream stream) const {
  SLOPE_CHECK(!empty(), "cuda::Linear::forward_bf16 on an empty Linear");
  SLOPE_CHECK(ct_ == kernels::ComputeType::BF16, "cuda::Linear::forward_bf16 needs a BF16-compute Linear");
  SLOPE_CHECK(M >= 0, "cuda::Linear::forward_bf16: negative row count ", M);
  if (M == 0) return;
  SLOPE_CHECK(x && y, "cuda::Linear::forward_bf16: null device pointer");
  gemm(x, M, y, accumulate, stream);
}

void to_bf16(const float* x, uint16_t* y, int64_t n, Stream stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
  SLOPE_CUDA_CHECK_LAUNCH("to_bf16_kernel");
}

void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
              float beta, float* C, int64_t ldc, bool transpose_b, Stream stream) {
  if (M <= 0 || N <= 0) return;
  SLOPE_CHECK(M <= 0x7fffffff && N <= 0x7fffffff && K <= 0x7fffffff, "cuda::gemm_f32: dimensions over 2^31");
  // Row-major C = A·op(B) is column-major Cᵀ = op(B)ᵀ·Aᵀ: B plays cuBLAS's A.
  SLOPE_CUBLAS_CHECK(cublasSgemm(cublas(stream), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M),
                                 int(K), &alpha, B, int(ldb), A, int(lda), &beta, C, int(ldc)));
}

}  // namespace slope::cuda
