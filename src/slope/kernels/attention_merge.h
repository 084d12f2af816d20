// Exact merge of partial attention results computed over disjoint key sets:
//   LSE = logaddexp(LSE_a, LSE_b)
//   O   = e^{LSE_a - LSE} O_a + e^{LSE_b - LSE} O_b
// and the sink finalisation, applied once after all blocks are merged:
//   LSE' = logaddexp(LSE, sink_h),  O' = O · e^{LSE - LSE'} = O · sigmoid(LSE - sink_h)
#pragma once

#include <cstdint>

namespace slope::kernels {

// (out_a, lse_a) <- merge((out_a, lse_a), (out_b, lse_b)).
// out_*: [n, H, D], lse_*: [n, H]. Rows with lse = -inf contribute nothing.
void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n,
                     int64_t H, int64_t D);

// Applies per-head sinks [H] once to merged (out, lse): out [n, H, D], lse [n, H] (updated).
void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H,
                           int64_t D);

}  // namespace slope::kernels
