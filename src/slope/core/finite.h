// Scans for NaN and Inf: one branch-free pass over a buffer (it vectorises and, for large
// buffers, runs on all threads), so a check after every layer costs far less than the layer.
#pragma once

#include <cstdint>

#include "slope/core/tensor.h"

namespace slope {

// True if no element of x[n] is NaN or ±Inf.
bool all_finite(const float* x, int64_t n);
// Index of the first NaN or ±Inf element, or -1 if all are finite.
int64_t first_nonfinite(const float* x, int64_t n);
// The same for a tensor of any dtype: F32, BF16 and F16 by their exponent bits; integer
// dtypes hold no NaN (-1).
int64_t first_nonfinite(const Tensor& t);

}  // namespace slope
