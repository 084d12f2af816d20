#include "slope/kernels/norm.h"

#include <algorithm>
#include <cmath>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/kernels/gemm.h"

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

// One bf16 row: the values of norm_row<kOrder, true>, as bf16 bits in yb (and f32 in y if given).
// The f32 results go through an L1 block so the rounding runs on whole vectors.
template <NormOrder kOrder>
void norm_row_bf16(const float* x, const float* w, uint16_t* yb, float* y, int64_t dim, float eps) {
  const float r = 1.0f / std::sqrt(sum_squares(x, dim) / float(dim) + eps);
  constexpr int64_t kBlock = 256;
  float tmp[kBlock];
  for (int64_t i0 = 0; i0 < dim; i0 += kBlock) {
    const int64_t len = std::min(kBlock, dim - i0);
    for (int64_t i = 0; i < len; ++i) {
      const float v = x[i0 + i] * r;
      if constexpr (kOrder == NormOrder::WeightThenCast)
        tmp[i] = w[i0 + i] * v;
      else
        tmp[i] = w[i0 + i] * round_bf16(v);  // the final rounding below makes it the bf16 product
    }
    to_bf16_serial(tmp, yb + i0, len);
    if (y)  // rounded as rmsnorm rounds (the vector conversion above flushes bf16 subnormals)
      for (int64_t i = 0; i < len; ++i) y[i0 + i] = round_bf16(tmp[i]);
  }
}

template <NormOrder kOrder, bool kBf16>
void norm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) norm_row<kOrder, kBf16>(x + r * dim, w, y + r * dim, dim, eps);
}

template <NormOrder kOrder>
void norm_rows_bf16(const float* x, const float* w, uint16_t* yb, float* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r)
    norm_row_bf16<kOrder>(x + r * dim, w, yb + r * dim, y ? y + r * dim : nullptr, dim, eps);
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

void rmsnorm_bf16(const float* x, const float* w, uint16_t* yb, float* y, int64_t rows, int64_t dim, float eps,
                  NormOrder order) {
  SLOPE_CHECK(dim > 0, "rmsnorm_bf16: dim must be positive, got ", dim);
  if (order == NormOrder::WeightThenCast)
    norm_rows_bf16<NormOrder::WeightThenCast>(x, w, yb, y, rows, dim, eps);
  else
    norm_rows_bf16<NormOrder::CastThenWeight>(x, w, yb, y, rows, dim, eps);
}

}  // namespace slope::kernels
