// RMSNorm on the GPU with the contract of kernels/norm.h (f32 math; the activation dtype says
// where values are rounded to bf16), on device pointers. No CUDA headers. Not yet run on a GPU.
#pragma once

#include <cstdint>

#include "slope/core/dtype.h"
#include "slope/cuda/device.h"
#include "slope/kernels/norm.h"

namespace slope::cuda {

// x, y: [rows, dim] f32 (y may alias x); w: [dim] f32. Throws for act_dtype other than F32/BF16.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             kernels::NormOrder order, DType act_dtype = DType::F32, Stream stream = nullptr);

// The BF16-activation result stored as bf16 bits (it is bf16-exact), ready for a bf16 GEMM:
// one pass over x instead of a norm and a separate cast.
void rmsnorm_to_bf16(const float* x, const float* w, uint16_t* y, int64_t rows, int64_t dim, float eps,
                     kernels::NormOrder order, Stream stream = nullptr);

}  // namespace slope::cuda
