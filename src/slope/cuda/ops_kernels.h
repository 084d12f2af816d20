// The small device kernels the CUDA ops::Backend needs beside the kernels of the other files:
// fills, adds, the finite check, row gathers and scatter-adds with int64 row indices (the op
// interface's), index widening and the embedding gather with dtype conversion. No CUDA headers.
// Not yet run on a GPU (docs/cuda.md).
#pragma once

#include <cstdint>

#include "slope/core/dtype.h"
#include "slope/cuda/device.h"

namespace slope::cuda {

void fill(float* x, int64_t n, float value, Stream stream = nullptr);
void add_inplace(float* y, const float* x, int64_t n, Stream stream = nullptr);
// Sets *flag (device int) to 1 if x [n] holds a NaN or an Inf; leaves it otherwise.
void flag_nonfinite(const float* x, int64_t n, int* flag, Stream stream = nullptr);
void gather_rows_i64(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst, Stream stream = nullptr);
void scatter_add_rows_i64(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim, float* dst,
                          Stream stream = nullptr);
void widen_i32(const int32_t* src, int64_t n, int64_t* dst, Stream stream = nullptr);
// out [n, width] f32 = table[ids[i]] for a device table of dtype F32, BF16 or F16 and device ids.
void embed(const void* table, DType dtype, int64_t width, const int32_t* ids, int64_t n, float* out,
           Stream stream = nullptr);

}  // namespace slope::cuda
