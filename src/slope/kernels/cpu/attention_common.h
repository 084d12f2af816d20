// Pieces shared by the CPU attention kernels (attention.cpp, f32; attention_bf16.cpp, bf16;
// attention_avx2.cpp, f32 on AVX2): the visible key range of a query block, the row
// finalisation (LSE, sinks), the unpacked arguments and the aligned buffers. Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "slope/kernels/attention.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace slope::kernels::attention_detail {

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2e = 1.44269504088896340736;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kInf = std::numeric_limits<double>::infinity();

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

// 64-byte aligned, uninitialised.
template <typename T>
struct AlignedFree {
  void operator()(T* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
template <typename T>
using Buf = std::unique_ptr<T[], AlignedFree<T>>;
template <typename T>
Buf<T> alloc(int64_t n) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
  return Buf<T>(static_cast<T*>(::operator new[](bytes, std::align_val_t(64))));
}

// A grow-only buffer of at least n T, 64-byte aligned, its contents undefined. The kernels keep
// their per-call K/V copies in thread_local ones: the engine calls attention once per layer per
// chunk, and fresh buffers cost a page fault per 4 KiB written each time.
template <typename T>
struct GrowBuf {
  Buf<T> buf;
  int64_t cap = 0;
  T* get(int64_t n) {
    if (n > cap) {
      buf.reset();  // before allocating the larger one: never both at once
      buf = alloc<T>(n);
      cap = n;
    }
    return buf.get();
  }
  int64_t bytes() const { return cap * int64_t(sizeof(T)); }
};

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
  // Element strides of k and v (the f32 AVX-512 kernel's; the others read [nk, Hkv, D]): between
  // rows, and between KV heads. [nk, Hkv, D]: Hkv·D and D; packed per head [Hkv][nk][D]: D and nk·D.
  int64_t kv_row_stride;
  int64_t kv_head_stride;
};

// Query vectors (16 rows each) per work unit. A block of B query rows under a window of W keys
// visits W + B - 1 keys for the W each row sees: 191 for 128 at B = 64, 159 at B = 32, 143 at
// B = 16. Windows shorter than 1024 keys take 32-row blocks (kAttentionWindowBlockQ), whose
// edge tiles go by vector (vector_keys, split_bands): 143 keys per row at W = 128, with the
// micro-kernels of two vectors over the band's middle; everything else 64 (kAttentionBlockQ),
// whose micro-kernels reuse each broadcast K or V value over more rows. (16-row blocks measured
// slower than 32 at W = 128, f32 and bf16, the 16 fewer keys notwithstanding: their
// micro-kernels load a broadcast value per vector FMA.)
constexpr int kMaxQueryVectors = 4;
constexpr int kWindowQueryVectors = 2;
static_assert(16 * kWindowQueryVectors == kAttentionWindowBlockQ, "attention.h states the tiles");
static_assert(kAttentionWindowVectorQ == 16, "attention.h states the tiles");
inline int query_vectors(const AttentionMask& mask) {
  return mask.window > 0 && mask.window < kAttentionWindowBlockMaxW ? kWindowQueryVectors
                                                                    : kMaxQueryVectors;
}

// Head-packed window blocks. Under a window shorter than kAttentionWindowBlockMaxW, where a KV
// head serves two or more query heads, a work unit is the same 16 positions
// (kAttentionWindowVectorQ) of nh <= 4 query heads of one KV group, one query vector per head:
// all nh vectors see the same W + 15 keys of the same KV head, so the key blocks run the
// micro-kernels of nh vectors over that band, each broadcast K or V value serving 16·nh rows
// (64 at 4 heads) instead of 16 to 32 in a 32-row block of one head, and the block's fixed work
// (queries, softmax state, finalisation) is spread over 16·nh rows. A group of more than 4
// heads takes ⌈group/4⌉ blocks of nearly equal size (8: 4 + 4, 6: 3 + 3, 5: 3 + 2). Each row
// computes the keys its 16-row vector computes in a 32-row block (W + 15, what the planner
// counts); the key blocks start at the 16 positions' first key instead of the 32 rows', which
// changes only the order of the f32 sums (and none of the bf16 kernel's rounded probabilities:
// attention_bf16.cpp).
constexpr int kMaxGroupVectors = kMaxQueryVectors;
static_assert(kAttentionWindowVectorQ == 16, "a head-packed block is one vector per head");
inline bool packs_heads(const Problem& pb) {
  return pb.mask.window > 0 && pb.mask.window < kAttentionWindowBlockMaxW && pb.Hkv > 0 &&
         pb.Hq / pb.Hkv >= 2;
}

// Heads h0 .. h0 + nh - 1 at query rows i0 .. i0 + 15 (fewer in the last block).
struct HeadBlock {
  int64_t h0;
  int nh;
  int64_t i0;
};

// The head-packed work units in the order t = 0, 1, ..: KV head, then head chunk, then
// position block (consecutive units take consecutive positions, whose bands overlap).
struct HeadBlocks {
  int64_t group, chunks, nqb, Hkv;
  explicit HeadBlocks(const Problem& pb)
      : group(pb.Hq / pb.Hkv),
        chunks((group + kMaxGroupVectors - 1) / kMaxGroupVectors),
        nqb((pb.nq + kAttentionWindowVectorQ - 1) / kAttentionWindowVectorQ),
        Hkv(pb.Hkv) {}
  int64_t count() const { return Hkv * chunks * nqb; }
  // Units a thread takes at a time: runs of up to 16 consecutive ones (at least 8 runs a thread),
  // so that a thread's next unit is the next 16 positions, whose keys are all but 16 of its own
  // (window-128 calls on AMX 1.08-1.10× faster than one at a time: docs/performance.md, fifteenth window).
  int64_t run(int64_t nthreads) const { return std::clamp<int64_t>(count() / (8 * nthreads), 1, 16); }
  HeadBlock at(int64_t t) const { return block(t % nqb, t / nqb % chunks, t / (nqb * chunks)); }
  // The same blocks with the rows outermost: every head of 16 rows, then the next 16 rows.
  HeadBlock by_rows(int64_t t) const { return block(t / (Hkv * chunks), t % chunks, t / chunks % Hkv); }

 private:
  // Rows 16b .. 16b + 15 of part c of KV head g's query heads.
  HeadBlock block(int64_t b, int64_t c, int64_t g) const {
    const int64_t a = c * group / chunks, e = (c + 1) * group / chunks;  // heads [a, e) of g
    return {g * group + a, static_cast<int>(e - a), b * kAttentionWindowVectorQ};
  }
};

// Calls f(std::integral_constant<int, nh>{}) for a head-packed block of nh heads: the kernels'
// attend_block takes the vector count at compile time. HeadBlocks makes blocks of 2 to 4 heads
// (a group of g >= 2 heads split into ceil(g / 4) near-equal parts).
template <typename F>
inline void with_block_heads(int nh, F&& f) {
  switch (nh) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
}

// Keys [lo, hi) of a key block, as indices into the block (or, halved, key pairs).
struct Band {
  int lo = 0, hi = 0;
};

// The keys of a key block that some row of query vector v sees: rows 16v .. 16v + 15 (fewer in
// a last, partial vector; none past nrows) of a block whose row 0 is at global position qa,
// against the block's nkeys keys at positions kp0, kp0 + 1, .., of which the first `unseen`
// are visible to no row. Each row sees a run of keys that starts and ends at most one key after
// the previous row's, so the union is one run, and both ends never decrease with v (an empty
// vector past nrows is {nkeys, nkeys}).
inline Band vector_keys(int v, int64_t qa, int nrows, int64_t kp0, int nkeys, int unseen,
                        const AttentionMask& mask) {
  const int r0 = 16 * v, r1 = std::min(16 * v + 16, nrows);
  if (r1 <= r0) return {nkeys, nkeys};
  int64_t lo = unseen, hi = nkeys;
  if (mask.window > 0) lo = std::max<int64_t>(lo, qa + r0 - mask.window + 1 - kp0);
  if (mask.causal) hi = std::min<int64_t>(hi, qa + r1 - kp0);
  lo = std::clamp<int64_t>(lo, 0, nkeys);
  hi = std::clamp<int64_t>(hi, lo, nkeys);
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

// A run of keys (or key pairs) [lo, hi) that exactly the query vectors v .. v + nv - 1 see.
struct Segment {
  int lo, hi, v, nv;
};

// The two vectors of a 32-row window block with bands b0, b1 as up to three runs: vector 0
// alone, both, vector 1 alone. Returns the count; seg[0 .. count) in key order. Where both
// bands are non-empty their ends must not decrease from b0 to b1 (vector_keys, and the pairs
// holding its keys).
inline int split_bands(Band b0, Band b1, Segment (&seg)[3]) {
  int n = 0;
  auto put = [&](int lo, int hi, int v, int nv) {
    if (lo < hi) seg[n++] = {lo, hi, v, nv};
  };
  if (b0.lo >= b0.hi || b1.lo >= b1.hi) {
    put(b0.lo, b0.hi, 0, 1);
    put(b1.lo, b1.hi, 1, 1);
    return n;
  }
  put(b0.lo, std::min(b0.hi, b1.lo), 0, 1);
  put(b1.lo, b0.hi, 0, 2);
  put(std::max(b0.hi, b1.lo), b1.hi, 1, 1);
  return n;
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

// A work unit of bq query rows of head h from row i0 prefetches the query rows of the unit the
// kernel hands out `ahead` places after it (the one this thread likely takes next: ahead = the
// thread count), at head h_next from row i0_next (h_next < 0: none), and its own output rows.
// Each kernel names the next unit from its own order.
inline void prefetch_for_block(const Problem& pb, int64_t h, int64_t i0, int64_t bq, int64_t h_next,
                               int64_t i0_next) {
  if (h_next >= 0) prefetch_rows(pb.q, i0_next, bq, pb, h_next, false);
  prefetch_rows(pb.out, i0, bq, pb, h, true);
}

// A head-packed unit u (HeadBlocks) prefetches the query rows of the unit `next` (nh = 0: none)
// and its own output rows, as prefetch_for_block does.
inline void prefetch_for_head_block(const Problem& pb, const HeadBlock& u, const HeadBlock& next) {
  for (int v = 0; v < next.nh; ++v)
    prefetch_rows(pb.q, next.i0, kAttentionWindowVectorQ, pb, next.h0 + v, false);
  for (int v = 0; v < u.nh; ++v)
    prefetch_rows(pb.out, u.i0, kAttentionWindowVectorQ, pb, u.h0 + v, true);
}

// The same for unit t of HeadBlocks' order and unit t + ahead.
inline void prefetch_for_head_block(const Problem& pb, const HeadBlocks& hb, int64_t t,
                                    int64_t ahead) {
  prefetch_for_head_block(pb, hb.at(t), t + ahead < hb.count() ? hb.at(t + ahead) : HeadBlock{0, 0, 0});
}

// ln x for 8 finite doubles x > 0: x = 2^e · m with m in [0.75, 1.5), ln m = 2 atanh(s) with
// s = (m - 1)/(m + 1) in [-1/7, 1/5), by its series to s^11 (truncation below 2e-10, far under
// the f32 the LSE is stored in).
inline __m512d log_pd(__m512d x) {
  const __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_zero);
  // getexp is floor(log2 x), the exponent of m in [1, 2); one more where m was halved.
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d e = _mm512_mask_add_pd(_mm512_getexp_pd(x), _mm512_cmp_pd_mask(m, one, _CMP_LT_OQ),
                                       _mm512_getexp_pd(x), one);
  const __m512d s = _mm512_div_pd(_mm512_sub_pd(m, one), _mm512_add_pd(m, one));
  const __m512d z = _mm512_mul_pd(s, s);
  __m512d p = _mm512_set1_pd(1.0 / 11);
  for (const double c : {1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3, 1.0})
    p = _mm512_fmadd_pd(p, z, _mm512_set1_pd(c));
  return _mm512_fmadd_pd(e, _mm512_set1_pd(kLn2), _mm512_mul_pd(_mm512_add_pd(s, s), p));
}

// e^y for 8 doubles y <= 0 (-inf and y below -745 give 0): y·log2 e = n + f, |f| <= 1/2,
// e^(f ln 2) by its Taylor series to degree 12 (truncation below 1e-14), times 2^n by vscalefpd.
inline __m512d exp_pd(__m512d y) {
  const __m512d x = _mm512_mul_pd(_mm512_max_pd(y, _mm512_set1_pd(-800.0)), _mm512_set1_pd(kLog2e));
  const __m512d n = _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512d g = _mm512_mul_pd(_mm512_sub_pd(x, n), _mm512_set1_pd(kLn2));
  double c = 1.0;
  for (int k = 2; k <= 12; ++k) c /= k;  // 1/12!
  __m512d p = _mm512_set1_pd(c);
  for (int k = 11; k >= 0; --k) {
    c *= k + 1;  // 1/k!
    p = _mm512_fmadd_pd(p, g, _mm512_set1_pd(c));
  }
  return _mm512_scalef_pd(p, n);
}

// finish_row for 8 rows at once (m2 and l as doubles, sink s or none), where every l is
// positive and finite and every m2 finite: lse = m2·ln2 + ln l, factor = 1/l; with the sink,
// lse' = logaddexp(lse, s) = max + ln(1 + t), t = e^(min - max), and factor · e^(lse - lse'),
// which is 1/(1 + t) where lse >= s and t/(1 + t) where s is larger.
inline void finish_rows8(__m512d m2, __m512d l, const float* sink, __m512d& lse_out,
                         __m512d& factor_out) {
  const __m512d one = _mm512_set1_pd(1.0);
  __m512d lse = _mm512_fmadd_pd(m2, _mm512_set1_pd(kLn2), log_pd(l));
  __m512d factor = _mm512_div_pd(one, l);
  if (sink) {
    const __m512d sv = _mm512_set1_pd(*sink);
    const __mmask8 sink_wins = _mm512_cmp_pd_mask(sv, lse, _CMP_GT_OQ);
    const __m512d hi = _mm512_max_pd(lse, sv), lo = _mm512_min_pd(lse, sv);
    const __m512d t = exp_pd(_mm512_sub_pd(lo, hi));
    const __m512d t1 = _mm512_add_pd(one, t);
    const __m512d w = _mm512_div_pd(_mm512_mask_blend_pd(sink_wins, one, t), t1);
    lse = _mm512_add_pd(hi, log_pd(t1));
    factor = _mm512_mul_pd(factor, w);
  }
  lse_out = lse;
  factor_out = factor;
}

// The output factors fac[r] (64-byte aligned; 0 past nrows) of a block of kBq query rows of
// head h from the running max m and sum l of each row, and lse[r, h] (finish_row) for its first
// nrows rows (rows Hq apart). Rows of 8 whose l are all positive and finite and m finite, with a
// finite sink or none, take finish_rows8; any other row finish_row.
template <int kBq>
inline void block_factors(const float* mrow, const float* lrow, int nrows, const Problem& pb,
                          int64_t h, float* lse, float* fac) {
  const float* sink = pb.sinks ? pb.sinks + h : nullptr;
  const bool sink_ok = !sink || std::isfinite(*sink);
  for (int r0 = 0; r0 < kBq; r0 += 8) {
    const __mmask8 rows = static_cast<__mmask8>(first_lanes(nrows - r0));
    if (rows == 0) {
      _mm256_store_ps(fac + r0, _mm256_setzero_ps());
      continue;
    }
    const __m512d m2 = _mm512_cvtps_pd(_mm256_load_ps(mrow + r0));
    const __m512d l = _mm512_cvtps_pd(_mm256_load_ps(lrow + r0));
    const __mmask8 ok = _mm512_cmp_pd_mask(l, _mm512_setzero_pd(), _CMP_GT_OQ) &
                        _mm512_cmp_pd_mask(l, _mm512_set1_pd(kInf), _CMP_LT_OQ) &
                        _mm512_cmp_pd_mask(_mm512_abs_pd(m2), _mm512_set1_pd(kInf), _CMP_LT_OQ);
    if (sink_ok && (ok & rows) == rows) {
      __m512d lv, fv;
      finish_rows8(m2, l, sink, lv, fv);
      _mm256_store_ps(fac + r0, _mm256_maskz_mov_ps(rows, _mm512_cvtpd_ps(fv)));
      alignas(32) float lf[8];
      _mm256_store_ps(lf, _mm512_cvtpd_ps(lv));
      for (int r = r0; r < r0 + 8 && r < nrows; ++r) lse[r * pb.Hq] = lf[r - r0];
    } else {
      for (int r = r0; r < r0 + 8; ++r) {
        if (r < nrows) {
          const RowFinal f = finish_row(mrow[r], lrow[r], pb.sinks, h);
          fac[r] = f.out_factor;
          lse[r * pb.Hq] = f.lse;
        } else {
          fac[r] = 0.0f;
        }
      }
    }
  }
}

// Finalises a block of kBq query rows of head h (attend_block in both kernels): from the
// transposed numerator ot [D][kLd] (its first kBq columns: one vector of a head-packed block
// is kBq = 16 columns of kLd = 16·nh) and the running max m and sum l of each row,
// out[r, h, :] = ot[:][r] · factor and lse[r, h] (block_factors), for the first nrows rows of
// out (rows qstride apart) and lse (rows Hq apart).
template <int kBq, int kLd = kBq>
inline void finish_block(const float* ot, const float* mrow, const float* lrow, int nrows,
                         const Problem& pb, int64_t h, float* out, float* lse) {
  const int64_t D = pb.D, qstride = pb.Hq * D;
  alignas(64) float fac[kBq];
  block_factors<kBq>(mrow, lrow, nrows, pb, h, lse, fac);
  // 16 x 16 tiles of ot · factor, transposed into the output rows.
  for (int r0 = 0; r0 < nrows; r0 += 16) {
    const __m512 f = _mm512_load_ps(fac + r0);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 t[16];
      for (int c = 0; c < 16; ++c)
        t[c] = d0 + c < D ? _mm512_mul_ps(_mm512_load_ps(ot + (d0 + c) * kLd + r0), f)
                          : _mm512_setzero_ps();
      transpose16(t);
      const __mmask16 dm = first_lanes(D - d0);
      for (int r = 0; r < 16 && r0 + r < nrows; ++r)
        _mm512_mask_storeu_ps(out + (r0 + r) * qstride + d0, dm, t[r]);
    }
  }
}

// Finalises a work unit of both kernels (attend_block): kQV query vectors with running max m and
// sum l, numerators in ot [D][16·kQV]. A unit of one head h is one block of 16·kQV rows from i0;
// a head-packed unit (kPacked) is vector v = head h + v at the same 16 rows.
template <int kQV, bool kPacked>
inline void finish_unit(const float* ot, const __m512 (&m)[kQV], const __m512 (&l)[kQV], int nrows,
                        const Problem& pb, int64_t h, int64_t i0) {
  constexpr int kBq = 16 * kQV;
  const int64_t qstride = pb.Hq * pb.D;
  alignas(64) float mrow[kBq], lrow[kBq];
  for (int v = 0; v < kQV; ++v) {
    _mm512_store_ps(mrow + 16 * v, m[v]);
    _mm512_store_ps(lrow + 16 * v, l[v]);
  }
  if constexpr (kPacked) {
    for (int v = 0; v < kQV; ++v)
      finish_block<16, kBq>(ot + 16 * v, mrow + 16 * v, lrow + 16 * v, nrows, pb, h + v,
                            pb.out + i0 * qstride + (h + v) * pb.D, pb.lse + i0 * pb.Hq + h + v);
  } else {
    finish_block<kBq>(ot, mrow, lrow, nrows, pb, h, pb.out + i0 * qstride + h * pb.D, pb.lse + i0 * pb.Hq + h);
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
// S = K·Q for the key runs `seg` of a banded window block (split_bands): each run's keys
// against the query vectors that see it, with the 2- or 1-vector QK micro-kernels of a kernel's
// Tiles (both kernels: q the block's packed queries, k rows kstride apart, dlen the reduction
// length their Qk takes, st rows kBq floats apart).
template <template <int, int> class Tiles, int kBq, int kNB, typename Q, typename K>
inline void qk_bands(const Segment* seg, int nseg, const Q* q, const K* k, int64_t kstride, int64_t dlen,
                     float* st) {
  for (int g = 0; g < nseg; ++g)
    for (int j = seg[g].lo; j < seg[g].hi; j += kNB) {
      const int nb = std::min(kNB, seg[g].hi - j);
      const Q* qg = q + 16 * seg[g].v;
      float* sg = st + j * kBq + 16 * seg[g].v;
      if (seg[g].nv == 2)
        dispatch_nb<Tiles<2, kBq>::template Qk, kNB>(nb, qg, k + j * kstride, kstride, dlen, sg);
      else
        dispatch_nb<Tiles<1, kBq>::template Qk, kNB>(nb, qg, k + j * kstride, kstride, dlen, sg);
    }
}

// The bf16 kernel (attention_bf16.cpp) on pb; false, having computed nothing, where it cannot
// run (no AVX512-BF16 in the build or the CPU, odd head_dim, scale not positive and finite).
bool run_bf16(const Problem& pb);

// The AVX2 + FMA kernel (attention_avx2.cpp) on pb; false, having computed nothing, where the
// build has no AVX2 or FMA.
bool run_avx2(const Problem& pb);

// The bytes of K/V copies each kernel keeps on the calling thread (attention_kept_bytes).
int64_t bf16_kept_bytes();
int64_t avx2_kept_bytes();

}  // namespace slope::kernels::attention_detail
