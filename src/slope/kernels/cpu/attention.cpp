// CPU flash attention (see attention.h for the contract).
//
// Work unit: one query head h and one block of kBq = 64 query rows (32 under a sliding window
// shorter than 1024 keys, query_vectors() in attention_common.h; there, where a KV head serves
// 2+ query heads, 16 positions of up to 4 heads of its group instead, HeadBlocks in
// attention_common.h, with a vector per head). The block's queries are
// packed transposed and pre-scaled, Qt[d][r] = q[r,h,d] · scale · log2(e), so every score is
// already in base 2 and the softmax needs only 2^x. Keys are then streamed in blocks of kBk,
// restricted to the index range some query of the block can see (causal and window), and for
// each key block:
//
//   St[j][r] = Σ_d K[j,d] · Qt[d][r]                  (scores, transposed: vectors over queries)
//   m'  = max(m, max_j St[j][·])                       (running row maximum, base 2)
//   α   = 2^(m - m'),  P[j][r] = 2^(St[j][r] - m')
//   l   = α·l + Σ_j P[j][·]                            (running denominator)
//   Ot  = α·Ot + Σ_j V[j,d] · P[j][·]                  (running numerator, Ot[d][r])
//
// and at the end out = Ot / l, lse = ln2·m + ln l (natural log). Keeping the query index in the
// vector lanes makes the row max, α and l plain vertical operations, needs no K or V packing
// (their elements are broadcast straight from [n, Hkv, D]), and works for any head_dim with the
// same code. Only key blocks crossing the causal diagonal or the window edge are masked. In a
// 32-row window block those edge tiles are triangles: there each 16-row query vector computes
// only the keys some row of it sees (its band, vector_keys in attention_common.h). A
// head-packed block's vectors hold the same 16 positions, so its whole key range is that band
// and it runs the plain micro-kernels of 2 to 4 vectors over it.
// Rows with no visible key keep m = -inf: we then subtract 0 instead of m (so -inf - -inf never
// occurs) and they finish with l = 0, out = 0, lse = -inf. A NaN score is not masked away: it
// makes its 2^x, l and the row's output NaN (exp2_ps keeps NaN), so corrupt inputs show.
//
// Sinks: the sink logit joins the denominator once, LSE' = logaddexp(LSE, sink) and
// out' = out · e^{LSE - LSE'} (the same finalisation as attention_apply_sinks).
#include "slope/kernels/attention.h"

// GCC 12 reports false 'may be used uninitialized' warnings inside AVX-512 intrinsics
// (_mm512_undefined_* in the headers, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include <omp.h>

#include "slope/kernels/cpu/attention_common.h"
#include "slope/kernels/cpu/exp2_avx512.h"
#include "slope/kernels/cpu/unit_shares.h"

namespace slope::kernels {
namespace {

using namespace attention_detail;

std::atomic<AttentionKernel> g_kernel{AttentionKernel::Auto};

#if defined(__AVX512F__)
constexpr bool kAvx512Kernel = true;

// Work unit: QV zmm vectors of queries (kBq = 16·QV rows, query_vectors() chooses) against key
// blocks of kBk; NB keys (QK) or head dims (PV) broadcast per micro-kernel step, QV·NB = 24 zmm
// accumulators.
constexpr int kBk = 64;
static_assert(kBk == kAttentionBlockK, "attention.h states the tiles");
static_assert(16 * kMaxQueryVectors == kAttentionBlockQ, "attention.h states the tiles");

// st[b][·] = Σ_d k[b,d] · qt[d][·] for NB keys and QV query vectors; k rows kstride apart, qt
// and st rows kBq floats apart (16·QV, or a block's full width when QV covers part of it).
// QV×NB zmm accumulators.
template <int NB, int QV, int kBq>
inline void qk_tile(const float* qt, const float* k, int64_t kstride, int64_t D, float* st) {
  constexpr int kQV = QV;
  __m512 acc[NB][kQV];
  for (int b = 0; b < NB; ++b)
    for (int v = 0; v < kQV; ++v) acc[b][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 qv[kQV];
    for (int v = 0; v < kQV; ++v) qv[v] = _mm512_load_ps(qt + d * kBq + 16 * v);
    for (int b = 0; b < NB; ++b) {
      const __m512 kb = _mm512_set1_ps(k[b * kstride + d]);
      for (int v = 0; v < kQV; ++v) acc[b][v] = _mm512_fmadd_ps(kb, qv[v], acc[b][v]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int v = 0; v < kQV; ++v) _mm512_store_ps(st + b * kBq + 16 * v, acc[b][v]);
}

// ot[b][·] = α · ot[b][·] + Σ_j v[j,b] · pt[j][·] for NB head dims b; v rows vstride apart.
// alpha null: ot starts from 0 (the first key block; ot is not read).
template <int NB, int QV>
inline void pv_tile(const float* pt, int nkeys, const float* v, int64_t vstride,
                    const __m512* alpha, float* ot) {
  constexpr int kQV = QV, kBq = 16 * QV;
  __m512 acc[NB][kQV];
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < kQV; ++q)
      acc[b][q] = alpha ? _mm512_mul_ps(_mm512_load_ps(ot + b * kBq + 16 * q), alpha[q])
                        : _mm512_setzero_ps();
  for (int j = 0; j < nkeys; ++j) {
    __m512 pv[kQV];
    for (int q = 0; q < kQV; ++q) pv[q] = _mm512_load_ps(pt + j * kBq + 16 * q);
    const float* vj = v + j * vstride;
    for (int b = 0; b < NB; ++b) {
      const __m512 vb = _mm512_set1_ps(vj[b]);
      for (int q = 0; q < kQV; ++q) acc[b][q] = _mm512_fmadd_ps(vb, pv[q], acc[b][q]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < kQV; ++q) _mm512_store_ps(ot + b * kBq + 16 * q, acc[b][q]);
}

// The keys [lo, hi) of pv_tile for the vectors V0 .. V0 + NV - 1 of a 32-row block.
template <int NB, int V0, int NV>
__attribute__((always_inline)) inline void pv_run(__m512 (&acc)[NB][2], const float* pt, int lo,
                                                  int hi, const float* v, int64_t vstride) {
  for (int j = lo; j < hi; ++j) {
    __m512 pv[NV];
    for (int q = 0; q < NV; ++q) pv[q] = _mm512_load_ps(pt + j * 32 + 16 * (V0 + q));
    const float* vj = v + j * vstride;
    for (int b = 0; b < NB; ++b) {
      const __m512 vb = _mm512_set1_ps(vj[b]);
      for (int q = 0; q < NV; ++q) acc[b][V0 + q] = _mm512_fmadd_ps(vb, pv[q], acc[b][V0 + q]);
    }
  }
}

// pv_tile for the two query vectors of a 32-row window block over key runs `seg`
// (split_bands): each key multiplies into the vectors whose band holds it.
template <int NB>
inline void pv_tile_bands(const float* pt, const Segment* seg, int nseg, const float* v,
                          int64_t vstride, const __m512* alpha, float* ot) {
  constexpr int kBq = 32;
  __m512 acc[NB][2];
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < 2; ++q)
      acc[b][q] = alpha ? _mm512_mul_ps(_mm512_load_ps(ot + b * kBq + 16 * q), alpha[q])
                        : _mm512_setzero_ps();
  for (int g = 0; g < nseg; ++g) {
    const Segment& sg = seg[g];
    if (sg.nv == 2)
      pv_run<NB, 0, 2>(acc, pt, sg.lo, sg.hi, v, vstride);
    else if (sg.v == 0)
      pv_run<NB, 0, 1>(acc, pt, sg.lo, sg.hi, v, vstride);
    else
      pv_run<NB, 1, 1>(acc, pt, sg.lo, sg.hi, v, vstride);
  }
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < 2; ++q) _mm512_store_ps(ot + b * kBq + 16 * q, acc[b][q]);
}

// QV query vectors of a block kBq rows wide.
template <int QV, int kBq = 16 * QV>
struct Tiles {
  template <int NB>
  struct Qk {
    static void run(const float* qt, const float* k, int64_t ks, int64_t D, float* st) {
      qk_tile<NB, QV, kBq>(qt, k, ks, D, st);
    }
  };
  template <int NB>
  struct Pv {
    static void run(const float* pt, int n, const float* v, int64_t vs, const __m512* a,
                    float* ot) {
      pv_tile<NB, QV>(pt, n, v, vs, a, ot);
    }
  };
  template <int NB>
  struct PvBands {
    static void run(const float* pt, const Segment* seg, int nseg, const float* v, int64_t vs,
                    const __m512* a, float* ot) {
      pv_tile_bands<NB>(pt, seg, nseg, v, vs, a, ot);
    }
  };
};

// Per-thread scratch, 64-byte aligned, for the largest block (kBq = kAttentionBlockQ).
struct Scratch {
  static constexpr int64_t kBq = kAttentionBlockQ;
  explicit Scratch(int64_t D)
      : qt(alloc(D * kBq)), ot(alloc(D * kBq)), st(alloc(int64_t{kBk} * kBq)) {}
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  using Buf = std::unique_ptr<float[], Free>;
  static Buf alloc(int64_t n) {
    return Buf(static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64))));
  }
  Buf qt;  // [D][kBq]   pre-scaled transposed queries
  Buf ot;  // [D][kBq]   running numerator
  Buf st;  // [kBk][kBq] scores, then probabilities
};

// One work unit: query rows i0 .. i0 + kBq - 1 of head h, or, kPacked, rows i0 .. i0 + 15 of
// the heads h .. h + QV - 1 of one KV group, vector v holding head h + v (HeadBlocks in
// attention_common.h). Callers prefetch (prefetch_for_block, prefetch_for_head_block).
template <int QV, bool kPacked = false>
void attend_block(const Problem& pb, int64_t h, int64_t i0, Scratch& s) {
  constexpr int kQV = QV, kBq = 16 * QV, kNB = 24 / QV;
  const int64_t D = pb.D;
  // Query rows (positions) of the block: a packed block's vectors share them.
  const int nrows = static_cast<int>(std::min<int64_t>(kPacked ? 16 : kBq, pb.nq - i0));
  const int64_t kvh = h / (pb.Hq / pb.Hkv);
  const int64_t qstride = pb.Hq * D, kvstride = pb.kv_row_stride;
  const int64_t qa = pb.q_pos0 + i0;  // global position of row 0
  // The row of lane 0 of vector v, and its head.
  auto row0 = [](int v) { return kPacked ? 0 : 16 * v; };
  auto head = [&](int v) { return kPacked ? h + v : h; };

  // Qt[d][16v + r] = q[i0 + row0(v) + r, head(v), d] · scale · log2 e, padded rows 0, in
  // 16 x 16 tiles.
  const __m512 qscale = _mm512_set1_ps(static_cast<float>(pb.scale * kLog2e));
  float* qt = s.qt.get();
  for (int r0 = 0; r0 < kBq; r0 += 16)
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const __mmask16 dm = first_lanes(D - d0);
      const int v = r0 / 16;
      const float* qv = pb.q + (i0 + row0(v)) * qstride + head(v) * D + d0;
      __m512 t[16];
      for (int r = 0; r < 16; ++r)
        t[r] = row0(v) + r < nrows
                   ? _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, qv + r * qstride), qscale)
                   : _mm512_setzero_ps();
      transpose16(t);
      for (int c = 0; c < 16 && d0 + c < D; ++c) _mm512_store_ps(qt + (d0 + c) * kBq + r0, t[c]);
    }
  float* ot = s.ot.get();
  float* st = s.st.get();

  __m512 m[kQV], l[kQV], alpha[kQV];
  for (int v = 0; v < kQV; ++v) {
    m[v] = _mm512_set1_ps(kNegInf);
    l[v] = _mm512_setzero_ps();
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);

  const KeyRange range = visible_keys(qa, qa + nrows - 1, pb.nk, pb.kv_pos0, pb.mask);
  // The first key block's PV writes Ot; with none, Ot stays 0.
  if (range.lo >= range.hi) std::memset(ot, 0, sizeof(float) * D * kBq);
  for (int64_t j0 = range.lo; j0 < range.hi; j0 += kBk) {
    const int nkeys = static_cast<int>(std::min<int64_t>(kBk, range.hi - j0));
    const float* kb = pb.k + j0 * kvstride + kvh * pb.kv_head_stride;
    const float* vb = pb.v + j0 * kvstride + kvh * pb.kv_head_stride;

    // Key j (position kp) is visible to rows r with r_min <= r < r_max, r_min = kp - qa
    // (causal), r_max = kp + W - qa (window).
    const int64_t kp0 = pb.kv_pos0 + j0;
    auto r_min = [&](int64_t kp) {
      return pb.mask.causal ? std::clamp<int64_t>(kp - qa, 0, kBq) : int64_t{0};
    };
    auto r_max = [&](int64_t kp) {
      return pb.mask.window > 0 ? std::clamp<int64_t>(kp + pb.mask.window - qa, 0, kBq)
                                : int64_t{kBq};
    };
    const bool full = r_min(kp0 + nkeys - 1) == 0 && r_max(kp0) >= nrows;
    // A window block's edge tiles are triangles: there each query vector computes only the
    // keys some row of it sees (its band), the others' scores are masked to -inf below and
    // their products skipped.
    const bool banded = !kPacked && kQV == kWindowQueryVectors && !full;
    Band band[kQV];
    Segment seg[3];
    int nseg = 0;
    if (banded) {
      for (int v = 0; v < kQV; ++v) band[v] = vector_keys(v, qa, nrows, kp0, nkeys, 0, pb.mask);
      nseg = split_bands(band[0], band[1], seg);
    }

    // S = K·Qt for this key block.
    if (!banded) {
      for (int j = 0; j < nkeys; j += kNB)
        dispatch_nb<Tiles<QV>::template Qk, kNB>(std::min(kNB, nkeys - j), qt, kb + j * kvstride,
                                                 kvstride, D, st + j * kBq);
    } else if constexpr (!kPacked && kQV == kWindowQueryVectors) {
      qk_bands<Tiles, kBq, kNB>(seg, nseg, qt, kb, kvstride, D, st);
    }

    // Mask if the block crosses the diagonal or the window edge.
    if (!full) {
      // Only the keys at the window edge and past the diagonal: a band's middle keys are
      // visible to every row.
      for (int j = 0; j < nkeys; ++j) {
        if (r_min(kp0 + j) == 0 && r_max(kp0 + j) >= nrows) continue;
        const __m512i lo = _mm512_set1_epi32(static_cast<int>(r_min(kp0 + j)));
        const __m512i hi = _mm512_set1_epi32(static_cast<int>(r_max(kp0 + j)));
        for (int v = 0; v < kQV; ++v) {
          const __m512i r = _mm512_add_epi32(lane, _mm512_set1_epi32(row0(v)));
          const __mmask16 vis = _mm512_cmpge_epi32_mask(r, lo) & _mm512_cmplt_epi32_mask(r, hi);
          float* p = st + j * kBq + 16 * v;
          _mm512_store_ps(p, _mm512_mask_blend_ps(vis, neg_inf, _mm512_load_ps(p)));
        }
      }
    }

    // Online softmax update, vertical over the query lanes; key-outer loops keep kQV
    // independent max/sum chains in flight.
    __m512 mx[kQV], muse[kQV], sum[kQV];
    for (int v = 0; v < kQV; ++v) mx[v] = m[v];
    for (int j = 0; j < nkeys; ++j)
      for (int v = 0; v < kQV; ++v)
        mx[v] = _mm512_max_ps(mx[v], _mm512_load_ps(st + j * kBq + 16 * v));
    for (int v = 0; v < kQV; ++v) {
      // Subtract 0 for rows that still see nothing, so their 2^(s - m) is 2^-inf = 0, not NaN.
      muse[v] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx[v], neg_inf, _CMP_EQ_OQ), mx[v],
                                     _mm512_setzero_ps());
      alpha[v] = cpu::exp2_ps(_mm512_sub_ps(m[v], muse[v]));
      sum[v] = _mm512_setzero_ps();
    }
    // (Banded: only the probabilities PV reads.)
    for (int j = 0; j < nkeys; ++j)
      for (int v = 0; v < kQV; ++v) {
        if (banded && (j < band[v].lo || j >= band[v].hi)) continue;
        float* p = st + j * kBq + 16 * v;
        const __m512 e = cpu::exp2_ps(_mm512_sub_ps(_mm512_load_ps(p), muse[v]));
        _mm512_store_ps(p, e);
        sum[v] = _mm512_add_ps(sum[v], e);
      }
    for (int v = 0; v < kQV; ++v) {
      l[v] = _mm512_fmadd_ps(l[v], alpha[v], sum[v]);
      m[v] = mx[v];
    }

    // Ot = α·Ot + Vᵀ·P (banded: each key into the vectors that see it); the first block
    // starts Ot from 0.
    const __m512* pv_alpha = j0 == range.lo ? nullptr : alpha;
    if (!banded) {
      for (int64_t d = 0; d < D; d += kNB)
        dispatch_nb<Tiles<QV>::template Pv, kNB>(static_cast<int>(std::min<int64_t>(kNB, D - d)),
                                                 st, nkeys, vb + d, kvstride, pv_alpha, ot + d * kBq);
    } else if constexpr (!kPacked && kQV == kWindowQueryVectors) {
      for (int64_t d = 0; d < D; d += kNB)
        dispatch_nb<Tiles<QV>::template PvBands, kNB>(
            static_cast<int>(std::min<int64_t>(kNB, D - d)), st, seg, nseg, vb + d, kvstride,
            pv_alpha, ot + d * kBq);
    }
  }

  // Finalise: out[i0 + r, h, :] = Ot[:][r] · factor, lse.
  finish_unit<kQV, kPacked>(ot, m, l, nrows, pb, h, i0);
}

template <int QV>
void run_blocks(const Problem& pb) {
  constexpr int kBq = 16 * QV;
  const int64_t nqb = (pb.nq + kBq - 1) / kBq;
  const int64_t tasks = nqb * pb.Hq;
#pragma omp parallel
  {
    Scratch s(pb.D);
    const int64_t ahead = omp_get_num_threads();
    // Later query blocks see more keys under a causal mask: hand them out first. Consecutive
    // tasks are heads of one query block, so GQA heads sharing a K/V head run close in time.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      // Unit t: query block nqb - 1 - t / Hq, head t % Hq.
      const int64_t qb = nqb - 1 - t / pb.Hq, n = t + ahead;
      prefetch_for_block(pb, t % pb.Hq, qb * kBq, kBq, n < tasks ? n % pb.Hq : -1,
                         (nqb - 1 - n / pb.Hq) * kBq);
      attend_block<QV>(pb, t % pb.Hq, qb * kBq, s);
    }
  }
}

// Head-packed window blocks (HeadBlocks), all of equal work, in shares of rows (UnitShares,
// HeadBlocks::by_rows: all heads of 16 rows, then the next 16), so that each thread reads and
// writes whole rows of queries and output, in order, and the keys of its own rows. Whole
// window-128 calls ran 1.05-1.08x faster than in runs of 16 of one KV head handed out
// dynamically (docs/performance.md, twenty-fifth window).
void run_head_blocks(const Problem& pb) {
  const HeadBlocks hb(pb);
  cpu::UnitShares shares(omp_get_max_threads());
#pragma omp parallel
  {
    const int tid = omp_get_thread_num();
    shares.set(tid, omp_get_num_threads(), hb.count());
    Scratch s(pb.D);
#pragma omp barrier
    shares.run(tid, [&](int64_t t, int64_t next) {
      const HeadBlock u = hb.by_rows(t);
      prefetch_for_head_block(pb, u, next >= 0 ? hb.by_rows(next) : HeadBlock{0, 0, 0});
      with_block_heads(u.nh, [&](auto nh) { attend_block<nh(), true>(pb, u.h0, u.i0, s); });
    });
  }
}

// Under full or long-window attention over several KV heads, K and V are first copied per KV
// head, [Hkv][keys][D], the keys some query of the call sees: each work unit then streams one
// contiguous run of its head's keys instead of every Hkv-th 4·D bytes, which the hardware
// prefetchers follow and the TLB covers (docs/performance.md, "eighth window": the prefill's
// own chunk calls 1.05-1.16x at 16K tokens, 1.11-1.20x at 32K). The copy is exact and the
// arithmetic the same, so the results are too. Short windows (head-packed blocks) read only
// W + 15 keys a unit, from cache: there the copy would cost more than it saves. The copies are
// kept per calling thread from call to call (attention_kept_bytes: in the memory prediction).
bool packs_kv(const Problem& pb) {
  return pb.Hkv > 1 && !(pb.mask.window > 0 && pb.mask.window < kAttentionWindowBlockMaxW);
}

thread_local GrowBuf<float> packed_k, packed_v;

Problem packed_kv(const Problem& pb) {
  const KeyRange r = visible_keys(pb.q_pos0, pb.q_pos0 + pb.nq - 1, pb.nk, pb.kv_pos0, pb.mask);
  const int64_t D = pb.D, n = std::max<int64_t>(0, r.hi - r.lo), Hkv = pb.Hkv;
  float *kd = packed_k.get(n * Hkv * D), *vd = packed_v.get(n * Hkv * D);
  const float *ks = n > 0 ? pb.k + r.lo * Hkv * D : pb.k, *vs = n > 0 ? pb.v + r.lo * Hkv * D : pb.v;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(kd + (g * n + j) * D, ks + (j * Hkv + g) * D, sizeof(float) * size_t(D));
      std::memcpy(vd + (g * n + j) * D, vs + (j * Hkv + g) * D, sizeof(float) * size_t(D));
    }
  Problem p = pb;  // the same keys at the same positions, from key r.lo on
  p.k = kd;
  p.v = vd;
  p.nk = n;
  p.kv_pos0 = pb.kv_pos0 + r.lo;
  p.kv_row_stride = D;
  p.kv_head_stride = n * D;
  return p;
}

int64_t f32_kept_bytes() { return packed_k.bytes() + packed_v.bytes(); }

void run(const Problem& pb0) {
  const Problem pb = packs_kv(pb0) ? packed_kv(pb0) : pb0;
  if (packs_heads(pb))
    run_head_blocks(pb);
  else if (query_vectors(pb.mask) == kWindowQueryVectors)
    run_blocks<kWindowQueryVectors>(pb);
  else
    run_blocks<kMaxQueryVectors>(pb);
}

#else  // portable fallback: one (row, head) at a time, two passes over the visible keys
constexpr bool kAvx512Kernel = false;

int64_t f32_kept_bytes() { return 0; }  // keeps no copies between calls

void run(const Problem& pb) {
  const int64_t D = pb.D, group = pb.Hq / pb.Hkv;
#pragma omp parallel
  {
    std::vector<double> s(pb.nk), acc(D);
#pragma omp for schedule(dynamic, 16)
    for (int64_t t = 0; t < pb.nq * pb.Hq; ++t) {
      const int64_t i = t / pb.Hq, h = t % pb.Hq, kvh = h / group;
      const KeyRange r = visible_keys(pb.q_pos0 + i, pb.q_pos0 + i, pb.nk, pb.kv_pos0, pb.mask);
      const float* qi = pb.q + (i * pb.Hq + h) * D;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = r.lo; j < r.hi; ++j) {
        const float* kj = pb.k + (j * pb.Hkv + kvh) * D;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
        s[j] = dot * pb.scale * kLog2e;
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = r.lo; j < r.hi; ++j) {
        const double p = std::exp2(s[j] - mx);
        l += p;
        const float* vj = pb.v + (j * pb.Hkv + kvh) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
      }
      const RowFinal f = finish_row(mx, l, pb.sinks, h);
      for (int64_t d = 0; d < D; ++d) pb.out[(i * pb.Hq + h) * D + d] = acc[d] * f.out_factor;
      pb.lse[i * pb.Hq + h] = f.lse;
    }
  }
}

#endif

}  // namespace

void flash_attention(const AttentionArgs& a) {
  const float *q = a.q, *k = a.k, *v = a.v, *sinks = a.sinks;
  const int64_t nq = a.nq, q_pos0 = a.q_pos0, nk = a.nk, kv_pos0 = a.kv_pos0;
  const AttentionShape& shape = a.shape;
  const AttentionMask& mask = a.mask;
  const float scale = a.scale;
  float *out = a.out, *lse = a.lse;
  if (nq <= 0 || shape.num_q_heads <= 0 || shape.head_dim <= 0) return;
  const Problem pb{q, k, v, nq, q_pos0, nk, kv_pos0, shape.num_q_heads, shape.num_kv_heads,
                   shape.head_dim, mask, scale, sinks, out, lse,
                   shape.num_kv_heads * shape.head_dim, shape.head_dim};
  if (a.compute == ComputeType::BF16 && bf16_units() == Bf16Units::Bf16 && run_bf16(pb)) return;
  if ((g_kernel.load(std::memory_order_relaxed) == AttentionKernel::Avx2 || !kAvx512Kernel) &&
      run_avx2(pb))
    return;
  run(pb);
}

int64_t attention_kept_bytes() {
  return f32_kept_bytes() + bf16_kept_bytes() + avx2_kept_bytes();
}

int64_t attention_kept_bytes_bound(int64_t nk, int64_t Hkv, int64_t D) {
  // The f32 kernels keep K and V in f32 for the visible keys: 8·nk·Hkv·D. The bf16 kernel keeps
  // K with up to 16 slots of padding and a shift slot, V's slot pairs, and on AMX V transposed
  // with slots rounded up to 16: at most (6·nk + 70)·Hkv·D. Its diagonal window units keep their
  // Ks (2 bytes a key and dim) and Vs (4) in the buffers of K and of V's pairs, over at most
  // nk + 47 slots: with a transposed V of an earlier call, at most (8·nk + 314)·Hkv·D.
  const int64_t n = std::max<int64_t>(nk, 0);
  return (std::max(8 * n, 6 * n + 70) + 320) * std::max<int64_t>(Hkv, 1) * std::max<int64_t>(D, 1);
}

void set_attention_kernel(AttentionKernel kernel) { g_kernel.store(kernel); }

bool avx2_attention_built() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

double attention_flops(int64_t nq, int64_t q_pos0, int64_t nk, int64_t kv_pos0,
                       const AttentionShape& shape, const AttentionMask& mask) {
  // Σ over query rows of its visible key count: O(nq), exact in integers.
  int64_t pairs = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const KeyRange r = visible_keys(q_pos0 + i, q_pos0 + i, nk, kv_pos0, mask);
    pairs += r.hi - r.lo;
  }
  return 4.0 * static_cast<double>(shape.head_dim) * static_cast<double>(shape.num_q_heads) *
         static_cast<double>(pairs);
}

}  // namespace slope::kernels
