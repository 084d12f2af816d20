#include "slope/kernels/copy.h"

#include <cstring>

#include "slope/core/error.h"
#include "slope/core/half.h"

namespace slope::kernels {

void copy_columns(const float* src, int64_t rows, int64_t src_cols, int64_t col0, int64_t cols, float* dst,
                  int64_t dst_stride) {
  if (dst_stride < 0) dst_stride = cols;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * dst_stride, src + r * src_cols + col0, size_t(cols) * sizeof(float));
}

void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;  // cache-sized tiles: both sides are read or written in lines
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (int64_t j0 = 0; j0 < cols; j0 += kTile)
      for (int64_t i = i0; i < std::min(rows, i0 + kTile); ++i)
        for (int64_t j = j0; j < std::min(cols, j0 + kTile); ++j) dst[j * rows + i] = src[i * cols + j];
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void gather_rows_f32(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n, float* out) {
  SLOPE_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
              "gather_rows_f32: a table of dtype ", dtype_name(dtype), " is not supported");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* dst = out + i * width;
    const int64_t row = int64_t(ids[i]) * width;
    if (dtype == DType::F32) {
      std::memcpy(dst, static_cast<const float*>(table) + row, size_t(width) * sizeof(float));
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(table) + row;
      for (int64_t j = 0; j < width; ++j) dst[j] = dtype == DType::BF16 ? bf16_to_f32(src[j]) : f16_to_f32(src[j]);
    }
  }
}

}  // namespace slope::kernels
