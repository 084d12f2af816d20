// Pieces shared by the CPU attention kernels (attention.cpp, f32; attention_bf16.cpp, bf16):
// the visible key range of a query block, the row finalisation (LSE, sinks) and the unpacked
// arguments. Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "slope/kernels/attention.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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
// visits W + B - 1 keys for the W each row sees: 191 for 128 at B = 64, 159 at B = 32, 143 at
// B = 16. Windows shorter than 1024 keys take 32-row blocks (kAttentionWindowBlockQ);
// everything else 64 (kAttentionBlockQ), whose micro-kernels reuse each broadcast K or V value
// over more rows. (16-row blocks measured slower than 32 at W = 128, f32 and bf16, the 16
// fewer keys notwithstanding: their micro-kernels load a broadcast value per vector FMA.)
constexpr int kMaxQueryVectors = 4;
constexpr int kWindowQueryVectors = 2;
static_assert(16 * kWindowQueryVectors == kAttentionWindowBlockQ, "attention.h states the tiles");
inline int query_vectors(const AttentionMask& mask) {
  return mask.window > 0 && mask.window < 1024 ? kWindowQueryVectors : kMaxQueryVectors;
}

#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"

// The first n lanes (none for n <= 0, all 16 for n >= 16).
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n <= 0 ? 0u : n >= 16 ? 0xffffu : (1u << n) - 1u);
}

// Transposes the 16 x 16 matrix of 32-bit values whose row i is r[i], in place.
__attribute__((always_inline)) inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  // t[2i], t[2i+1]: per 128-bit lane L, (r2i, r2i+1) interleaved at columns 4L, 4L+1 / 4L+2, 4L+3.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c]: per lane L, column 4L + c of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // Column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
    r[8 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
  }
}

// Prefetches rows [i0, i0 + n) of head h of a [nq, Hq, D] tensor (q or out) into L2, for
// writing if `write`. A block's rows of one head lie a whole row of heads apart, a stride the
// hardware prefetchers do not follow; under a short window a block computes too little to hide
// those misses, so each block fetches the next block's queries and its own output rows.
inline void prefetch_rows(const float* x, int64_t i0, int64_t n, const Problem& pb, int64_t h,
                          bool write) {
  const int64_t stride = pb.Hq * pb.D;
  for (int64_t r = i0; r < std::min(i0 + n, pb.nq); ++r) {
    const char* row = reinterpret_cast<const char*>(x + r * stride + h * pb.D);
    // Inline asm: GCC 12 drops these loops of __builtin_prefetch.
    for (int64_t b = 0; b < pb.D * int64_t{sizeof(float)}; b += 64) {
      if (write)
        asm volatile("prefetchw %0" : : "m"(row[b]));
      else
        asm volatile("prefetcht1 %0" : : "m"(row[b]));
    }
  }
}

// Work units run in the order t = 0, 1, ..: query block nqb - 1 - t / Hq (the last first), head
// t % Hq. The unit (h, i0) prefetches the query rows of the unit `ahead` places after it in that
// order (the one this thread likely takes next: ahead = the thread count), and its own output
// rows (prefetch_rows).
inline void prefetch_for_block(const Problem& pb, int64_t h, int64_t i0, int64_t bq,
                               int64_t ahead) {
  const int64_t nqb = (pb.nq + bq - 1) / bq;
  const int64_t next = (nqb - 1 - i0 / bq) * pb.Hq + h + ahead;
  if (next < nqb * pb.Hq)
    prefetch_rows(pb.q, (nqb - 1 - next / pb.Hq) * bq, bq, pb, next % pb.Hq, false);
  prefetch_rows(pb.out, i0, bq, pb, h, true);
}

// Finalises a block of kBq query rows of head h (attend_block in both kernels): from the
// transposed numerator ot [D][kBq] and the running max m and sum l of each row,
// out[r, h, :] = ot[:][r] · factor and lse[r, h] (finish_row), for the first nrows rows of out
// (rows qstride apart) and lse (rows Hq apart).
template <int kBq>
inline void finish_block(const float* ot, const float* mrow, const float* lrow, int nrows,
                         const Problem& pb, int64_t h, float* out, float* lse) {
  const int64_t D = pb.D, qstride = pb.Hq * D;
  alignas(64) float fac[kBq];
  for (int r = 0; r < kBq; ++r) {
    if (r < nrows) {
      const RowFinal f = finish_row(mrow[r], lrow[r], pb.sinks, h);
      fac[r] = f.out_factor;
      lse[r * pb.Hq] = f.lse;
    } else {
      fac[r] = 0.0f;
    }
  }
  // 16 x 16 tiles of ot · factor, transposed into the output rows.
  for (int r0 = 0; r0 < nrows; r0 += 16) {
    const __m512 f = _mm512_load_ps(fac + r0);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 t[16];
      for (int c = 0; c < 16; ++c)
        t[c] = d0 + c < D ? _mm512_mul_ps(_mm512_load_ps(ot + (d0 + c) * kBq + r0), f)
                          : _mm512_setzero_ps();
      transpose16(t);
      const __mmask16 dm = first_lanes(D - d0);
      for (int r = 0; r < 16 && r0 + r < nrows; ++r)
        _mm512_mask_storeu_ps(out + (r0 + r) * qstride + d0, dm, t[r]);
    }
  }
}

#pragma GCC diagnostic pop
#endif  // __AVX512F__

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
