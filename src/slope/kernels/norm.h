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

// rmsnorm with a bf16 activation dtype, writing the bf16 rows a bf16 GEMM reads
// (gemm.h Linear::forward_bf16) in the same pass: yb [rows, dim] holds the bits of
// rmsnorm(..., DType::BF16), whose values are bf16 already, so to_bf16(rmsnorm(...)) == yb bit for
// bit. With y non-null the f32 rows are written too (y may alias x; yb may not).
void rmsnorm_bf16(const float* x, const float* w, uint16_t* yb, float* y, int64_t rows, int64_t dim, float eps,
                  NormOrder order);

}  // namespace slope::kernels
