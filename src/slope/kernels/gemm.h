// Linear layers: y[M,N] = x[M,K] · Wᵀ + b, activations f32, weights prepacked once at load.
// Compute types: F32 (f32 weights and math) and BF16 (bf16 weights, x rounded to bf16, f32
// accumulation). Backed by oneDNN matmul with prepacked weights (chosen by measurement, see
// docs/performance.md).
#pragma once

#include <cstdint>
#include <memory>

#include "slope/core/dtype.h"
#include "slope/kernels/bf16_units.h"

namespace slope::kernels {

enum class ComputeType { F32, BF16 };

// How a weight matrix is laid out in memory.
//   OutIn: [N, K] row-major (torch nn.Linear.weight, y = x Wᵀ)
//   InOut: [K, N] row-major (gpt-oss expert tensors, y = x W)
enum class WeightLayout { OutIn, InOut };

class Linear {
 public:
  Linear();
  // `weight` has dtype `wdtype` (F32, BF16 or F16) and layout `layout`; `bias` is optional f32 [N].
  // Data is copied (and converted/prepacked) so the caller's buffers may be freed afterwards.
  Linear(const void* weight, DType wdtype, WeightLayout layout, int64_t out_features,
         int64_t in_features, const float* bias, ComputeType ct);
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;
  ~Linear();

  // y[M, N] = x[M, K] · Wᵀ (+ bias). With accumulate, y += instead of y =.
  // x and y are contiguous row-major f32. Thread-safe for concurrent calls with distinct y.
  void forward(const float* x, int64_t M, float* y, bool accumulate = false) const;
  // The same from rows already rounded to bf16, x [M, K] (a BF16 Linear only): for callers that
  // write the bf16 rows in a pass they make anyway (kernels/moe.h gather_rows_bf16,
  // swiglu_oai_bf16), so no separate conversion pass runs. forward_bf16(to_bf16(x)) equals
  // forward(x) bit for bit.
  void forward_bf16(const uint16_t* x, int64_t M, float* y, bool accumulate = false) const;

  int64_t in_features() const;
  int64_t out_features() const;
  size_t weight_bytes() const;  // bytes held for the packed weight
  ComputeType compute_type() const;
  bool empty() const { return impl_ == nullptr; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void run(const void* src, int64_t M, float* y, bool accumulate) const;  // src in compute dtype
  void run_rows(const void* src, int64_t M, float* y, bool accumulate) const;  // one oneDNN call
};

// A BF16 Linear computes on the units bf16_units() names when it is constructed
// (kernels/bf16_units.h): oneDNN's bf16 matmul on the packed bf16 weights, or f32 copies of them
// on the f32 matmul.
// Whether oneDNN has a bf16 matmul on this CPU.
bool native_bf16_matmul_supported();

// Whether oneDNN's f32 matmul here packs the weights again inside every call (its gemm:jit, which
// oneDNN 2.6 runs on CPUs without AVX-512) instead of using the copy Linear packed once. There a
// call's cost per row falls with its row count, so callers should make calls of many rows: one
// thread of a Zen 3 at N 2048, K 1024 ran 33-42 GFLOP/s at 128 rows and 69-82 at 512
// (docs/performance.md, "nineteenth window").
bool f32_matmul_packs_per_call();

// How many matmul primitives Linear has built in this process (each new row count of a shape
// builds one): for tests and diagnostics.
int64_t gemm_primitives_built();

// y[n] = x[n] rounded to bf16 (nearest even), over the threads: what a BF16 Linear does to its
// input rows before the GEMM.
void to_bf16(const float* x, uint16_t* y, int64_t n);
// The same on the calling thread only (for one row inside a caller's parallel loop).
void to_bf16_serial(const float* x, uint16_t* y, int64_t n);

// Plain f32 GEMM, C[M,N] = alpha · A[M,K] · B[K,N] (+ beta·C), row-major with leading dimensions.
// Used for small or one-off products where prepacking does not pay.
void gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc, bool transpose_b = false);

}  // namespace slope::kernels
