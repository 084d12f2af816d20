// Data movement and element-wise ops that the model and the engine would otherwise write as
// host loops: column slices of row-major matrices (splitting a fused projection, tensor-parallel
// slices), transposes, residual adds, embedding gathers. One op, one contract; the CPU
// implementation is in cpu/copy.cpp, and a device backend implements the same contract.
#pragma once

#include <cstdint>

#include "slope/core/dtype.h"

namespace slope::kernels {

// dst [rows, cols] = src[r, col0 .. col0 + cols) for each row r of src [rows, src_cols].
// dst_stride (elements between dst rows, >= cols) defaults to cols.
void copy_columns(const float* src, int64_t rows, int64_t src_cols, int64_t col0, int64_t cols, float* dst,
                  int64_t dst_stride = -1);

// dst [cols, rows] = srcᵀ for src [rows, cols].
void transpose(const float* src, int64_t rows, int64_t cols, float* dst);

// y[i] += x[i], i < n.
void add_inplace(float* y, const float* x, int64_t n);

// out [n, width] = table[ids[i]] for a row-major table [*, width] of dtype F32, BF16 or F16,
// converted to f32 exactly. The caller has checked the ids.
void gather_rows_f32(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n, float* out);

}  // namespace slope::kernels
