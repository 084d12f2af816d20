// RMSNorm: y = w · x / sqrt(mean(x²) + eps), computed in f32. Models differ in where the
// activation is cast to the model dtype:
//   WeightThenCast (gpt-oss):       out = (w · y).to(dtype)
//   CastThenWeight (llama, qwen):   out = w · y.to(dtype)
// With a f32 activation dtype both orders are the same; with BF16 the casts round to bf16.
#pragma once

#include <cstdint>

#include "slope/core/dtype.h"

namespace slope::kernels {

enum class NormOrder { WeightThenCast, CastThenWeight };

// x, y: [rows, dim] (y may alias x); w: [dim] f32.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             NormOrder order, DType act_dtype = DType::F32);

}  // namespace slope::kernels
