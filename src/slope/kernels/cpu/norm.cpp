#include "slope/kernels/norm.h"

#include <cmath>

#include "slope/core/error.h"
#include "slope/core/half.h"

namespace slope::kernels {
namespace {

// Σ x² in f32 with 16 independent partial sums (one zmm), as a vectorised torch reduction does.
float sum_squares(const float* x, int64_t dim) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
  }
  float s = 0.f;
  for (; i < dim; ++i) s += x[i] * x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

template <NormOrder kOrder, bool kBf16>
void norm_row(const float* x, const float* w, float* y, int64_t dim, float eps) {
  const float r = 1.0f / std::sqrt(sum_squares(x, dim) / float(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) {
    const float v = x[i] * r;
    if constexpr (!kBf16) {
      y[i] = w[i] * v;
    } else if constexpr (kOrder == NormOrder::WeightThenCast) {
      y[i] = round_bf16(w[i] * v);              // (w · y).to(bf16)
    } else {
      y[i] = round_bf16(w[i] * round_bf16(v));  // w · y.to(bf16), product in bf16
    }
  }
}

template <NormOrder kOrder, bool kBf16>
void norm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) norm_row<kOrder, kBf16>(x + r * dim, w, y + r * dim, dim, eps);
}

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             NormOrder order, DType act_dtype) {
  SLOPE_CHECK(dim > 0, "rmsnorm: dim must be positive, got ", dim);
  SLOPE_CHECK(act_dtype == DType::F32 || act_dtype == DType::BF16,
              "rmsnorm: activation dtype ", dtype_name(act_dtype), " is not supported (F32, BF16)");
  if (act_dtype == DType::F32) {
    norm_rows<NormOrder::WeightThenCast, false>(x, w, y, rows, dim, eps);
  } else if (order == NormOrder::WeightThenCast) {
    norm_rows<NormOrder::WeightThenCast, true>(x, w, y, rows, dim, eps);
  } else {
    norm_rows<NormOrder::CastThenWeight, true>(x, w, y, rows, dim, eps);
  }
}

}  // namespace slope::kernels
