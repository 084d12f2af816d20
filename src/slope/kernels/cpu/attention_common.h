// Pieces shared by the CPU attention kernels (attention.cpp, f32; attention_bf16.cpp, bf16):
// the visible key range of a query block, the row finalisation (LSE, sinks) and the unpacked
// arguments. Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "slope/kernels/attention.h"

namespace slope::kernels::attention_detail {

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2e = 1.44269504088896340736;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Visible key index range [lo, hi) of k/v for the query positions [p_first, p_last].
struct KeyRange {
  int64_t lo = 0, hi = 0;
};

inline KeyRange visible_keys(int64_t p_first, int64_t p_last, int64_t nk, int64_t kv_pos0,
                             const AttentionMask& mask) {
  int64_t lo = 0, hi = nk;
  if (mask.window > 0) lo = std::max<int64_t>(lo, p_first - mask.window + 1 - kv_pos0);
  if (mask.causal) hi = std::min<int64_t>(hi, p_last + 1 - kv_pos0);
  lo = std::min(lo, nk);
  hi = std::max<int64_t>(hi, 0);
  return {lo, std::max(lo, hi)};
}

// Final row values from the running state (base-2 max m, denominator l, numerator already
// divided by l by the caller): lse in natural log, and the factor that applies the sink.
struct RowFinal {
  float lse;
  float out_factor;  // multiplies numerator / l
};

inline RowFinal finish_row(double m2, double l, const float* sinks, int64_t h) {
  // A NaN score or value reached this row (l or m is NaN): the row is NaN, as in a reference
  // softmax, never "no visible key".
  if (std::isnan(l) || std::isnan(m2)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {nan, nan};
  }
  if (!(l > 0.0)) {
    // No visible key: out = 0; with a sink the row is all sink, lse = sink.
    return {sinks ? sinks[h] : kNegInf, 0.0f};
  }
  double lse = m2 * kLn2 + std::log(l);
  double factor = 1.0;
  if (sinks) {
    // LSE' = logaddexp(LSE, sink), out' = out · e^{LSE - LSE'}.
    const double s = sinks[h];
    const double hi = std::max(lse, s), lo = std::min(lse, s);
    const double lse2 = std::isinf(lo) ? hi : hi + std::log1p(std::exp(lo - hi));
    factor = std::exp(lse - lse2);
    lse = lse2;
  }
  return {static_cast<float>(lse), static_cast<float>(factor / l)};
}

// flash_attention's arguments. q: [nq, Hq, D], k/v: [nk, Hkv, D], out: [nq, Hq, D], lse: [nq, Hq].
struct Problem {
  const float* q;
  const float* k;
  const float* v;
  int64_t nq, q_pos0, nk, kv_pos0;
  int64_t Hq, Hkv, D;
  AttentionMask mask;
  float scale;
  const float* sinks;
  float* out;
  float* lse;
};

// Query vectors (16 rows each) per work unit. A block of B query rows under a window of W keys
// visits W + B - 1 keys for the W each row sees: 191 for 128 at B = 64, 159 at B = 32. Windows
// shorter than 1024 keys take 32-row blocks (kAttentionWindowBlockQ); everything else 64
// (kAttentionBlockQ), whose micro-kernels reuse each broadcast K or V value over more rows.
constexpr int kMaxQueryVectors = 4;
static_assert(16 * 2 == kAttentionWindowBlockQ, "attention.h states the tiles");
inline int query_vectors(const AttentionMask& mask) {
  return mask.window > 0 && mask.window < 1024 ? 2 : kMaxQueryVectors;
}

// Calls F<nb>::run for nb in 1..N (the micro-kernels need a compile-time count).
template <template <int> class F, int N, typename... Args>
inline void dispatch_nb(int nb, Args... args) {
  if constexpr (N == 1) {
    F<1>::run(args...);
  } else {
    if (nb >= N)
      F<N>::run(args...);
    else
      dispatch_nb<F, N - 1>(nb, args...);
  }
}
// The bf16 kernel (attention_bf16.cpp) on pb; false, having computed nothing, where it cannot
// run (no AVX512-BF16 in the build or the CPU, odd head_dim, scale not positive and finite).
bool run_bf16(const Problem& pb);

}  // namespace slope::kernels::attention_detail
