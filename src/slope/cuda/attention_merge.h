// The LSE merge of partial attention results and the one-time sink application of
// kernels/attention_merge.h, on device pointers (f32 out and lse, as flash_attention writes
// them). No CUDA headers here. Not yet run on a GPU (docs/cuda.md).
#pragma once

#include <cstdint>

#include "slope/cuda/device.h"

namespace slope::cuda {

// (out_a, lse_a) <- merge((out_a, lse_a), (out_b, lse_b)); out_*: [n, H, D], lse_*: [n, H].
void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n, int64_t H,
                     int64_t D, Stream stream = nullptr);

// Applies per-head sinks [H] once to merged (out [n, H, D], lse [n, H]).
void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H, int64_t D,
                           Stream stream = nullptr);

}  // namespace slope::cuda
