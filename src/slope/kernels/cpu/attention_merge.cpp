// LSE merge of partial attention results and the one-time sink finalisation (see
// attention_merge.h). Each (row, head) is independent:
//
//   merge:  LSE = logaddexp(a, b) = max(a,b) + log1p(e^{-|a-b|})
//           O   = e^{a-LSE}·O_a + e^{b-LSE}·O_b
//   sinks:  LSE' = logaddexp(LSE, sink),  O' = O·e^{LSE-LSE'}
//
// An -inf LSE means "no visible key" (its O row is 0), so it contributes weight 0; both -inf
// stays -inf with O = 0. Weights are computed in double per row, the row update in float.
#include "slope/kernels/attention_merge.h"

#include <algorithm>
#include <cmath>

namespace slope::kernels {
namespace {

// logaddexp that is exact for -inf operands (never -inf - -inf).
double logaddexp(double a, double b) {
  const double hi = std::max(a, b), lo = std::min(a, b);
  if (std::isinf(lo) && lo < 0) return hi;
  return hi + std::log1p(std::exp(lo - hi));
}

}  // namespace

void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b, int64_t n,
                     int64_t H, int64_t D) {
  const int64_t rows = n * H;
#pragma omp parallel for schedule(static) if (rows * D > (1 << 16))
  for (int64_t t = 0; t < rows; ++t) {
    const double a = lse_a[t], b = lse_b[t];
    if (std::isinf(b) && b < 0) continue;  // b contributes nothing
    float* oa = out_a + t * D;
    const float* ob = out_b + t * D;
    if (std::isinf(a) && a < 0) {  // a is empty: take b
      std::copy(ob, ob + D, oa);
      lse_a[t] = lse_b[t];
      continue;
    }
    const double lse = logaddexp(a, b);
    const float wa = static_cast<float>(std::exp(a - lse));
    const float wb = static_cast<float>(std::exp(b - lse));
    for (int64_t d = 0; d < D; ++d) oa[d] = wa * oa[d] + wb * ob[d];
    lse_a[t] = static_cast<float>(lse);
  }
}

void attention_apply_sinks(float* out, float* lse, const float* sinks, int64_t n, int64_t H,
                           int64_t D) {
  const int64_t rows = n * H;
#pragma omp parallel for schedule(static) if (rows * D > (1 << 16))
  for (int64_t t = 0; t < rows; ++t) {
    const double l = lse[t];
    const double l2 = logaddexp(l, sinks[t % H]);
    // l = -inf: O is 0 and stays 0, LSE' = sink. l2 = -inf only if both are -inf: leave as is.
    if (std::isinf(l2) && l2 < 0) continue;
    const float f = static_cast<float>(std::exp(l - l2));
    float* o = out + t * D;
    for (int64_t d = 0; d < D; ++d) o[d] *= f;
    lse[t] = static_cast<float>(l2);
  }
}

}  // namespace slope::kernels
