// Linear layers on the GPU through cuBLAS, with the contract of kernels/gemm.h on device
// pointers: y[M, N] = x[M, K] · Wᵀ (+ b), f32 activations, the weight copied to the device once
// at construction (converted there to the compute type). BF16 compute rounds x to bf16 and
// accumulates in f32 (cublasGemmEx, CUBLAS_COMPUTE_32F), as the CPU BF16 path does; F32 compute
// is a plain f32 SGEMM (no TF32). No CUDA headers. Not yet run on a GPU.
#pragma once

#include <cstdint>

#include "slope/core/dtype.h"
#include "slope/cuda/buffer.h"
#include "slope/cuda/device.h"
#include "slope/kernels/gemm.h"

namespace slope::cuda {

class Linear {
 public:
  Linear() = default;
  // `weight` (host memory) has dtype F32, BF16 or F16 and `layout`; `bias` is an optional host
  // f32 [N]. Throws slope::Error for empty shapes or an unsupported dtype.
  Linear(const void* weight, DType wdtype, kernels::WeightLayout layout, int64_t out_features, int64_t in_features,
         const float* bias, kernels::ComputeType ct);

  // y[M, N] (device, f32) = x[M, K] (device, f32) · Wᵀ (+ bias); with accumulate, y += instead.
  // BF16 compute converts x into a stream-ordered scratch buffer first.
  void forward(const float* x, int64_t M, float* y, bool accumulate = false, Stream stream = nullptr) const;
  // BF16 compute with x already bf16 (raw bits), e.g. from rmsnorm_to_bf16: no conversion pass.
  void forward_bf16(const uint16_t* x, int64_t M, float* y, bool accumulate = false, Stream stream = nullptr) const;

  int64_t in_features() const { return K_; }
  int64_t out_features() const { return N_; }
  size_t weight_bytes() const { return weight_.bytes(); }
  bool empty() const { return N_ == 0; }

 private:
  void gemm(const void* x, int64_t M, float* y, bool accumulate, Stream stream) const;

  DeviceBuffer weight_;  // the layout as given, in the compute type
  DeviceBuffer bias_;    // [N] f32, or empty
  kernels::WeightLayout layout_ = kernels::WeightLayout::OutIn;
  kernels::ComputeType ct_ = kernels::ComputeType::F32;
  int64_t N_ = 0, K_ = 0;
};

// y[n] = x[n] rounded to bf16 (nearest even), on device pointers.
void to_bf16(const float* x, uint16_t* y, int64_t n, Stream stream = nullptr);

// C[M,N] = alpha · A[M,K] · B (+ beta·C), row-major device matrices with leading dimensions;
// B is [K,N], or [N,K] with transpose_b (kernels::gemm_f32's contract). f32 SGEMM.
void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
              float beta, float* C, int64_t ldc, bool transpose_b = false, Stream stream = nullptr);

}  // namespace slope::cuda
