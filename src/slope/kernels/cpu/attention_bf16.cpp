// CPU flash attention in bf16 (attention.h, compute = BF16): the f32 kernel's algorithm and
// tiles (attention.cpp: queries in the vector lanes, 64 or 32 rows of a head per block or 16
// positions of up to 4 heads of a KV group, keys streamed in blocks of 64 with an online
// softmax) with QKᵀ and PV on vdpbf16ps, which multiplies pairs of bf16 and adds both products
// to an f32 lane:
//
//   acc[i] += a[2i]·b[2i] + a[2i+1]·b[2i+1]
//
// Each product therefore contracts over a pair of adjacent values of its reduction index, and
// the operand in the lanes is packed in pairs:
//
//   QKᵀ, over d:  Qp[i][r] = (q[r,2i], q[r,2i+1])      times the broadcast (k[j,2i], k[j,2i+1]),
//                 from K rounded to bf16 once per call into Kh[Hkv][n][D]
//   PV,  over j:  Pp[i][r] = (P[2i][r], P[2i+1][r])    times the broadcast (v[2i,d], v[2i+1,d]),
//                 from V packed once per call as Vp[Hkv][⌈n/2⌉][D] key pairs
//
// K and V are rounded to bf16 once per call, Q once per (head, query block). q and k are rounded
// as they are and the scores accumulated unscaled; c = scale·log2(e) is applied in the softmax
// pass, where max_j(c·s_j) = c·max_j(s_j) (c > 0). So up to f32 rounding this is exact
// attention of bf16(q), bf16(k), bf16(v), except that the probabilities are rounded to bf16 for
// PV (relative error at most 2^-8 in each weight; the denominator sums the unrounded ones). The
// softmax, its running sum and the LSE are the f32 kernel's, but the weights' 2^x is
// exp2_weights_ps (relative error 2.4e-7 against exp2_ps's 1e-7, in fewer operations: the weights
// are rounded to bf16 next), and the running max m is rounded up to an integer: then
// 2^(c·s - m) for two values of m differs by an exact power of two (c·s is rounded once, and
// c·s - m is exact whenever m is near c·s), so its bf16 rounding does not
// depend on where the keys were split into blocks or calls (nor on how rows were grouped into
// blocks: the max, its rounding and each probability are per row). Without it, a ring's K/V blocks
// round the probabilities differently from one rank's, and bf16 activations amplify that (a
// near tie in a MoE router picks another expert for a token).
//
// Key pairs start at even global positions (a call whose kv_pos0 is odd gets an empty slot
// before its first key), so a sequence split into several calls (a ring's K/V blocks) pairs
// its keys as one call does. A window's first visible key, if odd, is preceded by the key
// before it, which no row sees and the mask gives probability 0, and a block with an odd count
// pairs its last key with probability 0. The V value of such an unseen partner is dropped
// from the broadcast pair (not multiplied by 0), so a NaN or Inf in a key no row may see stays
// out, as in the f32 kernel, which never reads keys outside the visible range.
//
// Where the CPU has AMX (amx.h; Sapphire Rapids and later) and head_dim is a multiple of 32, the
// blocks that are not window bands run QKᵀ and PV on the tile unit instead, with the same
// operands and the same layouts: S tiles are 16 keys x 16 query lanes of st, from a K tile (16
// keys x 32 dims of Kh, rows as they are) and a Q tile (16 dim pairs x 16 query lanes of Qp); Ot
// tiles are 16 head dims x 16 query lanes, from a Vᵀ tile (16 dims x 32 key slots, packed once
// per call as Vt[Hkv][D][slots]) and a P tile (16 key pairs x 16 query lanes of Pp). PV takes
// all of a block's key pairs in runs of 16: a run that holds a slot no row of the block sees (an
// unseen partner before an odd window start, the slots past the block's keys) reads a copy of
// its Vᵀ slots with those set to 0, and P's pairs past the block are 0 (pv_amx_block), so the
// unseen partners' V stays out, as in the vector micro-kernel. Only the order of the f32 sums
// changes (tdpbf16ps, like vdpbf16ps, rounds to nearest even and flushes denormals).
//
// Causal windows of a multiple of 16 keys up to 160, head_dim a multiple of 32, without AMX,
// run on diagonal units instead of key blocks (diagonal_units, attend_diagonals): lane r of
// diagonal j holds key b0 + r + j, so each of a unit's 16 rows computes only its own W keys
// rather than the W + 16 of the blocks that cover all of them. Ks and Vs are packed once per
// part of kDiagonalRows rows with the keys in the lanes, and each diagonal's vector is cut from
// two aligned loads by valignd. Each thread packs the keys of, and runs the units of, its own
// share of a part's rows (UnitShares). Products, rounding and softmax are the blocks'; only the
// order of the f32 sums changes (set_diagonal_window_attention(false) takes the blocks, for tests).
#include "slope/kernels/attention.h"

// GCC 12 reports false '(may be) used uninitialized' warnings inside AVX-512 intrinsics
// (_mm512_undefined_* in the headers, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include <omp.h>

#include "slope/core/log.h"
#include "slope/core/sys.h"
#include "slope/kernels/cpu/amx.h"
#include "slope/kernels/cpu/attention_common.h"
#include "slope/kernels/cpu/exp2_avx512.h"
#include "slope/kernels/cpu/unit_shares.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512BF16__)
#define SLOPE_ATTENTION_BF16 1
#include <immintrin.h>
#else
#define SLOPE_ATTENTION_BF16 0
#endif

namespace slope::kernels {
namespace attention_detail {
namespace {

#if SLOPE_ATTENTION_BF16

// Work unit: QV zmm vectors of queries (kBq = 16·QV rows, query_vectors() chooses) against key
// blocks of kBk (even, so that blocks start on key pairs); NB keys (QK) or head dims (PV)
// broadcast per micro-kernel step, QV·NB = 24 zmm accumulators.
constexpr int kBk = 64;
static_assert(kBk == kAttentionBlockK && kBk % 2 == 0, "attention.h states the tiles");
// Key blocks on AMX: 160 keys, a multiple of 32 (the tiles' PV runs). A block's fixed work (the
// row max and rescaling of Ot, the Ot tiles' loads and stores, the edge runs) then comes once
// per 160 keys instead of 64 (with 128, 256 and 512 about the same), and one block holds all the
// W + 16 slots of a head-packed window unit at W = 128 (docs/performance.md, tenth window). The
// blocks visit the same keys as 64-key ones (those some row of the unit sees), so the planner's
// tile counts (kAttentionBlockK) still hold.
constexpr int kAmxBk = 160;
constexpr int kMaxBk = std::max(kBk, kAmxBk);
static_assert(16 * kMaxQueryVectors == kAttentionBlockQ, "attention.h states the tiles");

// The 32 floats x = (a, b) in bf16, rounded to nearest even, a NaN staying a (quiet) NaN;
// 32-bit lane i holds the pair (x[2i], x[2i+1]), low half the even one. vcvtne2ps2bf16 reads a
// denormal as 0, as vdpbf16ps and tdpbf16ps would read it anyway.
inline __m512i bf16_pairs(__m512 a, __m512 b) { return (__m512i)_mm512_cvtne2ps_pbh(b, a); }

// dst[i] = bf16(src[i]) for i < n.
void to_bf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    const __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, b);
  }
}

// The 32 bf16 of cvtne2ps_pbh(b, a) = [a0..a15, b0..b15] reordered to pairs (a_i, b_i).
inline __m512i pair_up(__m512 a, __m512 b) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                              9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                              17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

// vp[h][i][d] = (bf16 v[2i - shift,h,d], bf16 v[2i + 1 - shift,h,d]) as one 32-bit pair (low
// half the even key), for the pairs i0 <= i < i1 of the ⌈(nk + shift)/2⌉; a partner outside
// 0 .. nk-1 is 0. v: [nk, Hkv, D].
void pack_v_pairs(const float* v, int64_t nk, int64_t shift, int64_t Hkv, int64_t D, int64_t i0,
                  int64_t i1, uint32_t* vp) {
  const int64_t np = (nk + shift + 1) / 2;
#pragma omp for collapse(2) schedule(static)
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = 2 * i - shift, b = a + 1;
      const float* r0 = a >= 0 ? v + (a * Hkv + h) * D : nullptr;
      const float* r1 = b < nk ? v + (b * Hkv + h) * D : nullptr;
      uint32_t* dst = vp + (h * np + i) * D;
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = first_lanes(D - d);
        const __m512 a = r0 ? _mm512_maskz_loadu_ps(m, r0 + d) : _mm512_setzero_ps();
        const __m512 b = r1 ? _mm512_maskz_loadu_ps(m, r1 + d) : _mm512_setzero_ps();
        _mm512_mask_storeu_epi32(dst + d, m, pair_up(a, b));
      }
    }
}

inline __m512bh load_pairs(const uint32_t* p) { return (__m512bh)_mm512_load_si512(p); }
inline __m512bh broadcast_pair(uint32_t pair) {
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
}

// st[b][·] = Σ_d k[b,d] · q[·,d] for NB keys and QV query vectors (unscaled); qp: [D/2][kBq]
// query pairs, st rows kBq apart (16·QV, or a block's full width when QV covers part of it), k
// rows (bf16) kstride apart.
template <int NB, int QV, int kBq>
inline void qk_tile(const uint32_t* qp, const uint16_t* k, int64_t kstride, int64_t Dh,
                    float* st) {
  constexpr int kQV = QV;
  __m512 acc[NB][kQV];
  for (int b = 0; b < NB; ++b)
    for (int v = 0; v < kQV; ++v) acc[b][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < Dh; ++i) {
    __m512bh qv[kQV];
    for (int v = 0; v < kQV; ++v) qv[v] = load_pairs(qp + i * kBq + 16 * v);
    for (int b = 0; b < NB; ++b) {
      uint32_t pair;
      std::memcpy(&pair, k + b * kstride + 2 * i, sizeof pair);
      const __m512bh kb = broadcast_pair(pair);
      for (int v = 0; v < kQV; ++v) acc[b][v] = _mm512_dpbf16_ps(acc[b][v], kb, qv[v]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int v = 0; v < kQV; ++v) _mm512_store_ps(st + b * kBq + 16 * v, acc[b][v]);
}

// acc[b][·] += v pair (i, b) · P pair (i, ·) for one key pair and the query vectors
// V0 .. V0 + NV - 1 (all QV by default); `keep` drops the half of a V pair whose key no row
// sees (kMask).
template <int NB, int QV, bool kMask, int V0 = 0, int NV = QV>
__attribute__((always_inline)) inline void pv_pair(__m512 (&acc)[NB][QV], const uint32_t* ppi,
                                                   const uint32_t* vi, uint32_t keep) {
  __m512bh pv[NV];
  for (int q = 0; q < NV; ++q) pv[q] = load_pairs(ppi + 16 * (V0 + q));
  for (int b = 0; b < NB; ++b) {
    uint32_t pair = vi[b];
    if constexpr (kMask) pair &= keep;
    const __m512bh vb = broadcast_pair(pair);
    for (int q = 0; q < NV; ++q) acc[b][V0 + q] = _mm512_dpbf16_ps(acc[b][V0 + q], vb, pv[q]);
  }
}

// ot[b][·] = α · ot[b][·] + Σ_i vp[i][b] · pp[i][·] over npairs key pairs, for NB head dims b;
// vp rows (key pairs) D apart. keep_first / keep_last mask the first and last V pair. alpha
// null: ot starts from 0 (the first key block; ot is not read).
template <int NB, int QV>
inline void pv_tile(const uint32_t* pp, int npairs, const uint32_t* vp, int64_t D,
                    uint32_t keep_first, uint32_t keep_last, const __m512* alpha, float* ot) {
  constexpr int kQV = QV, kBq = 16 * QV;
  __m512 acc[NB][kQV];
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < kQV; ++q)
      acc[b][q] = alpha ? _mm512_mul_ps(_mm512_load_ps(ot + b * kBq + 16 * q), alpha[q])
                        : _mm512_setzero_ps();
  if (npairs == 1) {
    pv_pair<NB, QV, true>(acc, pp, vp, keep_first & keep_last);
  } else if (npairs > 1) {
    pv_pair<NB, QV, true>(acc, pp, vp, keep_first);
    for (int i = 1; i < npairs - 1; ++i) pv_pair<NB, QV, false>(acc, pp + i * kBq, vp + i * D, 0);
    pv_pair<NB, QV, true>(acc, pp + (npairs - 1) * kBq, vp + (npairs - 1) * D, keep_last);
  }
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < kQV; ++q) _mm512_store_ps(ot + b * kBq + 16 * q, acc[b][q]);
}

// The pairs [lo, hi) of pv_tile for the vectors V0 .. V0 + NV - 1 of a 32-row block.
template <int NB, int V0, int NV>
__attribute__((always_inline)) inline void pv_run(__m512 (&acc)[NB][2], const uint32_t* pp,
                                                  int lo, int hi, int npairs, const uint32_t* vp,
                                                  int64_t D, uint32_t keep_first,
                                                  uint32_t keep_last) {
  for (int i = lo; i < hi; ++i) {
    const uint32_t* ppi = pp + i * 32;
    const uint32_t* vi = vp + i * D;
    if (i == 0 || i == npairs - 1)
      pv_pair<NB, 2, true, V0, NV>(
          acc, ppi, vi, (i == 0 ? keep_first : ~0u) & (i == npairs - 1 ? keep_last : ~0u));
    else
      pv_pair<NB, 2, false, V0, NV>(acc, ppi, vi, 0);
  }
}

// pv_tile for the two query vectors of a 32-row window block over key-pair runs `seg`
// (split_bands): each pair multiplies into the vectors whose band holds it.
template <int NB>
inline void pv_tile_bands(const uint32_t* pp, int npairs, const Segment* seg, int nseg,
                          const uint32_t* vp, int64_t D, uint32_t keep_first, uint32_t keep_last,
                          const __m512* alpha, float* ot) {
  constexpr int kBq = 32;
  __m512 acc[NB][2];
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < 2; ++q)
      acc[b][q] = alpha ? _mm512_mul_ps(_mm512_load_ps(ot + b * kBq + 16 * q), alpha[q])
                        : _mm512_setzero_ps();
  for (int g = 0; g < nseg; ++g) {
    const Segment& sg = seg[g];
    if (sg.nv == 2)
      pv_run<NB, 0, 2>(acc, pp, sg.lo, sg.hi, npairs, vp, D, keep_first, keep_last);
    else if (sg.v == 0)
      pv_run<NB, 0, 1>(acc, pp, sg.lo, sg.hi, npairs, vp, D, keep_first, keep_last);
    else
      pv_run<NB, 1, 1>(acc, pp, sg.lo, sg.hi, npairs, vp, D, keep_first, keep_last);
  }
  for (int b = 0; b < NB; ++b)
    for (int q = 0; q < 2; ++q) _mm512_store_ps(ot + b * kBq + 16 * q, acc[b][q]);
}

#if SLOPE_AMX
// The tile instructions name their registers in the instruction itself: S or Ot tiles of query
// vector v in tmm v (v < 4), the K or Vᵀ tile in tmm4, the Q or P tile in tmm5. GCC 12's tile
// intrinsics are asm statements that do not say they touch memory, so each tile step is fenced
// for the compiler (tile_fence) against the vector code that writes and reads the same buffers.
inline void tile_fence() { asm volatile("" ::: "memory"); }
template <int T>
inline void tile_load(const void* p, int64_t stride) {
  static_assert(T >= 0 && T < 4);
  if constexpr (T == 0) _tile_loadd(0, p, stride);
  if constexpr (T == 1) _tile_loadd(1, p, stride);
  if constexpr (T == 2) _tile_loadd(2, p, stride);
  if constexpr (T == 3) _tile_loadd(3, p, stride);
}
template <int T>
inline void tile_store(void* p, int64_t stride) {
  if constexpr (T == 0) _tile_stored(0, p, stride);
  if constexpr (T == 1) _tile_stored(1, p, stride);
  if constexpr (T == 2) _tile_stored(2, p, stride);
  if constexpr (T == 3) _tile_stored(3, p, stride);
}
template <int T>
inline void tile_zero() {
  if constexpr (T == 0) _tile_zero(0);
  if constexpr (T == 1) _tile_zero(1);
  if constexpr (T == 2) _tile_zero(2);
  if constexpr (T == 3) _tile_zero(3);
}
// tmm T += tmm4 · tmm5.
template <int T>
inline void tile_dp() {
  if constexpr (T == 0) _tile_dpbf16ps(0, 4, 5);
  if constexpr (T == 1) _tile_dpbf16ps(1, 4, 5);
  if constexpr (T == 2) _tile_dpbf16ps(2, 4, 5);
  if constexpr (T == 3) _tile_dpbf16ps(3, 4, 5);
}
// f(integral_constant<int, v>) for v = 0 .. QV - 1.
template <int QV, typename F>
__attribute__((always_inline)) inline void each_vector(F&& f) {
  [&]<int... V>(std::integer_sequence<int, V...>) {
    (f(std::integral_constant<int, V>{}), ...);
  }(std::make_integer_sequence<int, QV>{});
}

// st[j][·] = Σ_d k[j,d] · q[·,d] for the keys of a block, in tiles of 16 keys (rows of st past
// nkeys, up to the next 16, get scores of whatever follows in Kh: scratch the softmax never
// reads); k: the block's first key in Kh, rows D apart; qp: [D/2][kBq]; D a multiple of 32.
template <int QV>
void qk_amx(const uint32_t* qp, const uint16_t* k, int64_t D, int nkeys, float* st) {
  constexpr int kBq = 16 * QV;
  tile_fence();
  for (int j = 0; j < nkeys; j += 16) {
    each_vector<QV>([](auto v) { tile_zero<v()>(); });
    for (int64_t d = 0; d < D; d += 32) {
      _tile_loadd(4, k + j * D + d, 2 * D);
      each_vector<QV>([&](auto v) {
        _tile_loadd(5, qp + d / 2 * kBq + 16 * v(), 4 * kBq);
        tile_dp<v()>();
      });
    }
    each_vector<QV>([&](auto v) { tile_store<v()>(st + j * kBq + 16 * v(), 4 * kBq); });
  }
  tile_fence();
}

// ot[d][·] = (zero ? 0 : ot[d][·]) + Σ_i vt_c[d][2i' .. 2i' + 1] · pp[i][·] over a block's key
// pairs i = 16c + i' (0 <= i' < 16) of the runs 0 <= c < nch; vt_c: run c's 32 slots of head dim 0,
// rows (head dims) stride_c slots apart; pp: [pairs][kBq].
template <int QV>
void pv_amx(const uint32_t* pp, int nch, const uint16_t* const* vt, const int64_t* stride, int64_t D,
            bool zero, float* ot) {
  constexpr int kBq = 16 * QV;
  tile_fence();
  for (int64_t d = 0; d < D; d += 16) {
    float* o = ot + d * kBq;
    each_vector<QV>([&](auto v) {
      if (zero)
        tile_zero<v()>();
      else
        tile_load<v()>(o + 16 * v(), 4 * kBq);
    });
    for (int c = 0; c < nch; ++c) {
      _tile_loadd(4, vt[c] + d * stride[c], 2 * stride[c]);
      each_vector<QV>([&](auto v) {
        _tile_loadd(5, pp + 16 * c * kBq + 16 * v(), 4 * kBq);
        tile_dp<v()>();
      });
    }
    each_vector<QV>([&](auto v) { tile_store<v()>(o + 16 * v(), 4 * kBq); });
  }
  tile_fence();
}

// vt[h][d][j] = bf16 v[j - shift, h, d] for the slots of [s0, s1) rounded out to 16 (a slot
// with no key, j < shift or j - shift >= nk, is 0); rows sp >= s1 rounded up to 16 slots apart.
void pack_v_transposed(const float* v, int64_t nk, int64_t shift, int64_t Hkv, int64_t D,
                       int64_t s0, int64_t s1, int64_t sp, uint16_t* vt) {
  const int64_t b0 = s0 / 16, b1 = (s1 + 15) / 16;
#pragma omp for collapse(2) schedule(static)
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t d0 = 0; d0 < D; d0 += 16) {
        __m512 t[16];
        for (int r = 0; r < 16; ++r) {
          const int64_t key = 16 * b + r - shift;
          t[r] = key >= 0 && key < nk
                     ? _mm512_maskz_loadu_ps(first_lanes(D - d0), v + (key * Hkv + h) * D + d0)
                     : _mm512_setzero_ps();
        }
        transpose16(t);
        for (int c = 0; c < 16 && d0 + c < D; ++c)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(vt + (h * D + d0 + c) * sp + 16 * b),
                              (__m256i)_mm512_cvtneps_pbh(t[c]));
      }
}
#endif  // SLOPE_AMX

// QV query vectors of a block kBq rows wide.
template <int QV, int kBq = 16 * QV>
struct Tiles {
  template <int NB>
  struct Qk {
    static void run(const uint32_t* qp, const uint16_t* k, int64_t ks, int64_t Dh, float* st) {
      qk_tile<NB, QV, kBq>(qp, k, ks, Dh, st);
    }
  };
  template <int NB>
  struct Pv {
    static void run(const uint32_t* pp, int n, const uint32_t* vp, int64_t D, uint32_t kf,
                    uint32_t kl, const __m512* a, float* ot) {
      pv_tile<NB, QV>(pp, n, vp, D, kf, kl, a, ot);
    }
  };
  template <int NB>
  struct PvBands {
    static void run(const uint32_t* pp, int n, const Segment* seg, int nseg, const uint32_t* vp,
                    int64_t D, uint32_t kf, uint32_t kl, const __m512* a, float* ot) {
      pv_tile_bands<NB>(pp, n, seg, nseg, vp, D, kf, kl, a, ot);
    }
  };
};

// Per-thread scratch, for the largest block (kBq = kAttentionBlockQ).
struct Scratch {
  static constexpr int64_t kBq = kAttentionBlockQ;
  explicit Scratch(int64_t D)
      : qp(alloc<uint32_t>(D / 2 * kBq)), ot(alloc<float>(D * kBq)),
        st(alloc<float>(int64_t{kMaxBk} * kBq)), pp(alloc<uint32_t>(int64_t{kMaxBk} / 2 * kBq)),
        vte(alloc<uint16_t>(2 * D * 32)), diag(alloc<uint32_t>(3 * D / 2 * (kMaxBk + 16))) {}
  Buf<uint32_t> qp;  // [D/2][kBq]  query pairs (bf16)
  Buf<float> ot;     // [D][kBq]    running numerator
  Buf<float> st;     // [kMaxBk][kBq]  unscaled scores
  Buf<uint32_t> pp;  // [kMaxBk/2][kBq] probability pairs (bf16)
  Buf<uint16_t> vte; // [2][D][32]  AMX: the edge runs' Vᵀ slots, those no row sees 0 (pv_amx_block)
  Buf<uint32_t> diag; // [D/2][W + 16] Ks, then [W + 16][D] Vr: a diagonal unit's slots (attend_diagonals)
};

// K and V of one call in bf16, indexed by key slot: slot j is key j - shift, so that key pairs
// (slots 2i, 2i + 1) start at even global positions whatever kv_pos0 is, and a sequence split
// into calls pairs its keys as one call does. With shift = 1 slot 0 holds no key (zeros).
// k16 [Hkv][slots][D], vp [Hkv][np][D] slot pairs: each KV head's keys are contiguous, so a
// block streams 128 B per key from one run of pages instead of every Hkv-th 128 B of K's
// [n, Hkv, D] rows (at 32K keys and 4 KV heads that run is 4 MiB against 16 MiB of pages: the
// TLB and the prefetchers keep up with the one and not the other).
// With AMX, vt [Hkv][D][sp] holds V transposed (pack_v_transposed), and null without.
struct PackedKv {
  const uint16_t* k16;
  int64_t slots;  // key slots per head: nk + shift
  const uint32_t* vp;
  int64_t np;     // slot pairs per head
  int64_t shift;  // kv_pos0 & 1
  const uint16_t* vt;
  int64_t sp;     // slots per row of vt
};

#if SLOPE_AMX
// Ot[d][·] (+)= Σ Vᵀ · P over a key block's npairs key pairs on the tiles, in runs of 16 pairs
// (32 slots) from slot j0, in one pass over Ot; the slots some row of the block sees are [lo, hi).
// A run inside them reads Vt as it is; an edge run (the first, whose even slot may be a key no
// row sees, and the last, which passes the block's keys) reads a copy of its 32 slots with the
// others set to 0 (vte, room for two), and P's pairs past npairs are set to 0, so that a NaN or
// Inf in a key no row may see stays out, as in the vector micro-kernel. zero: Ot starts from 0
// (not read).
template <int QV>
void pv_amx_block(uint32_t* pp, int npairs, const PackedKv& kv, int64_t kvh, int64_t j0,
                  int64_t lo, int64_t hi, int64_t D, bool zero, float* ot, uint16_t* vte) {
  constexpr int kBq = 16 * QV;
  constexpr int kRuns = kMaxBk / 32;
  const int runs = (npairs + 15) / 16;
  for (int i = npairs; i < 16 * runs; ++i)
    for (int v = 0; v < QV; ++v) _mm512_store_si512(pp + i * kBq + 16 * v, _mm512_setzero_si512());
  const uint16_t* vt = kv.vt + kvh * D * kv.sp + j0;
  const uint16_t* src[kRuns];
  int64_t stride[kRuns];
  int edges = 0;
  for (int r = 0; r < runs; ++r) {
    const int64_t s0 = j0 + 32 * r;
    if (s0 >= lo && s0 + 32 <= hi) {
      src[r] = vt + 32 * r;
      stride[r] = kv.sp;
      continue;
    }
    const int a = static_cast<int>(std::clamp<int64_t>(lo - s0, 0, 32));
    const int b = static_cast<int>(std::clamp<int64_t>(hi - s0, a, 32));
    const auto seen = static_cast<__mmask32>(((uint64_t{1} << (b - a)) - 1) << a);
    uint16_t* e = vte + edges++ * D * 32;  // [lo, hi) is one run of slots: at most two edges
    for (int64_t d = 0; d < D; ++d)
      _mm512_store_si512(e + 32 * d, _mm512_maskz_loadu_epi16(seen, vt + d * kv.sp + 32 * r));
    src[r] = e;
    stride[r] = 32;
  }
  pv_amx<QV>(pp, runs, src, stride, D, zero, ot);
}
#endif  // SLOPE_AMX

// Qp[i][16v + r] = (q[i0 + row0(v) + r, head(v), 2i], .., 2i + 1]) in bf16 for a unit of QV
// query vectors (attend_block's rows and heads), padded rows 0, in tiles of 16 rows x 16 pairs.
template <int QV, bool kPacked>
void pack_queries(const Problem& pb, int64_t h, int64_t i0, int nrows, uint32_t* qp) {
  constexpr int kBq = 16 * QV;
  const int64_t D = pb.D, Dh = D / 2, qstride = pb.Hq * D;
  for (int r0 = 0; r0 < kBq; r0 += 16)
    for (int64_t i0p = 0; i0p < Dh; i0p += 16) {
      const int64_t d0 = 2 * i0p;
      const int v = r0 / 16;
      const int row0 = kPacked ? 0 : 16 * v;
      const int64_t head = kPacked ? h + v : h;
      __m512 t[16];
      for (int r = 0; r < 16; ++r) {
        if (row0 + r < nrows) {
          const float* qr = pb.q + (i0 + row0 + r) * qstride + head * D + d0;
          const __m512 a = _mm512_maskz_loadu_ps(first_lanes(D - d0), qr);
          const __m512 b = _mm512_maskz_loadu_ps(first_lanes(D - d0 - 16), qr + 16);
          t[r] = _mm512_castsi512_ps(bf16_pairs(a, b));
        } else {
          t[r] = _mm512_setzero_ps();
        }
      }
      transpose16(t);
      for (int c = 0; c < 16 && i0p + c < Dh; ++c)
        _mm512_store_ps(reinterpret_cast<float*>(qp + (i0p + c) * kBq + r0), t[c]);
    }
}

// One work unit: query rows i0 .. i0 + kBq - 1 of head h, or, kPacked, rows i0 .. i0 + 15 of
// the heads h .. h + QV - 1 of one KV group, vector v holding head h + v (HeadBlocks in
// attention_common.h); see attend_block in attention.cpp for the f32 original. Callers
// prefetch. kAmx: the unit runs on the AMX tiles (kv.vt is set exactly then), in key blocks
// of kAmxBk.
template <int QV, bool kPacked = false, bool kAmx = false>
void attend_block(const Problem& pb, const PackedKv& kv, int64_t h, int64_t i0, Scratch& s) {
  constexpr int kQV = QV, kBq = 16 * QV, kNB = 24 / QV;
  const int64_t D = pb.D, Dh = D / 2;
  // Query rows (positions) of the block: a packed block's vectors share them.
  const int nrows = static_cast<int>(std::min<int64_t>(kPacked ? 16 : kBq, pb.nq - i0));
  const int64_t kvh = h / (pb.Hq / pb.Hkv);
  const int64_t qa = pb.q_pos0 + i0;  // global position of row 0
  // The row of lane 0 of vector v.
  auto row0 = [](int v) { return kPacked ? 0 : 16 * v; };

  uint32_t* qp = s.qp.get();
  pack_queries<kQV, kPacked>(pb, h, i0, nrows, qp);
  float* ot = s.ot.get();
  float* st = s.st.get();
  uint32_t* pp = s.pp.get();

  const __m512 c = _mm512_set1_ps(static_cast<float>(pb.scale * kLog2e));
  __m512 m[kQV], l[kQV], alpha[kQV];
  for (int v = 0; v < kQV; ++v) {
    m[v] = _mm512_set1_ps(kNegInf);
    l[v] = _mm512_setzero_ps();
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);

  // The visible keys as slots [lo, hi). Blocks start on a slot pair: an odd first visible slot
  // brings the one before it, which no row sees (masked below) or holds no key.
  KeyRange range = visible_keys(qa, qa + nrows - 1, pb.nk, pb.kv_pos0, pb.mask);
  range.lo += kv.shift;
  range.hi += kv.shift;
  const int64_t start = range.lo < range.hi ? range.lo & ~int64_t{1} : range.hi;
  // The first key block's PV writes Ot; with none, Ot stays 0.
  if (start >= range.hi) std::memset(ot, 0, sizeof(float) * D * kBq);
  // 32-row window units of one head (kBands) keep 64-key blocks: their blocks that are not full
  // run on the vector band kernels, and longer blocks would leave fewer of them full.
  constexpr bool kBands = !kPacked && kQV == kWindowQueryVectors;
  // A compile-time block size: with a run-time one (kAmxBk or kBk per call) GCC compiled the
  // vector path's loops over a block 1.28x slower (bf16 causal 16K on the Zen 4,
  // docs/performance.md, sixteenth window).
  constexpr int64_t bk = kAmx && !kBands ? kAmxBk : kBk;
  for (int64_t j0 = start; j0 < range.hi; j0 += bk) {
    const int nkeys = static_cast<int>(std::min<int64_t>(bk, range.hi - j0));
    const int npairs = (nkeys + 1) / 2;
    const uint16_t* kb = kv.k16 + (kvh * kv.slots + j0) * D;
    const uint32_t* vb = kv.vp ? kv.vp + (kvh * kv.np + j0 / 2) * D : nullptr;

    // Key j (position kp) is visible to rows r_min <= r < r_max; a slot before range.lo to
    // none.
    const int64_t kp0 = pb.kv_pos0 - kv.shift + j0;
    auto r_min = [&](int64_t kp) {
      return pb.mask.causal ? std::clamp<int64_t>(kp - qa, 0, kBq) : int64_t{0};
    };
    auto r_max = [&](int64_t kp) {
      return pb.mask.window > 0 ? std::clamp<int64_t>(kp + pb.mask.window - qa, 0, kBq)
                                : int64_t{kBq};
    };
    const bool full = j0 >= range.lo && r_min(kp0 + nkeys - 1) == 0 && r_max(kp0) >= nrows;
    // A window block's edge tiles are triangles: there each query vector computes only the
    // keys some row of it sees (its band; for PV the key pairs holding them), the others'
    // scores are masked to -inf below and their probabilities and products skipped.
    const bool banded = kBands && !full;
    Band band[kQV], pband[kQV];
    Segment seg[3], pseg[3];
    int nseg = 0, npseg = 0;
    if (banded) {
      const int unseen = static_cast<int>(std::clamp<int64_t>(range.lo - j0, 0, nkeys));
      for (int v = 0; v < kQV; ++v) {
        band[v] = vector_keys(v, qa, nrows, kp0, nkeys, unseen, pb.mask);
        pband[v] = band[v].lo < band[v].hi ? Band{band[v].lo / 2, (band[v].hi + 1) / 2} : Band{};
      }
      nseg = split_bands(band[0], band[1], seg);
      npseg = split_bands(pband[0], pband[1], pseg);
    }

    // S = K·Qᵀ for this key block, unscaled.
    if (!banded && kAmx) {
#if SLOPE_AMX
      qk_amx<QV>(qp, kb, D, nkeys, st);
#endif
    } else if (!banded) {
      for (int j = 0; j < nkeys; j += kNB)
        dispatch_nb<Tiles<QV>::template Qk, kNB>(std::min(kNB, nkeys - j), qp, kb + j * D, D, Dh,
                                                 st + j * kBq);
    } else if constexpr (kBands) {
      qk_bands<Tiles, kBq, kNB>(seg, nseg, qp, kb, D, Dh, st);
    }

    // Mask exactly as the f32 kernel.
    if (!full) {
      for (int j = 0; j < nkeys; ++j) {
        const bool none = j0 + j < range.lo;
        // A band's middle keys are visible to every row.
        if (!none && r_min(kp0 + j) == 0 && r_max(kp0 + j) >= nrows) continue;
        const __m512i lo = _mm512_set1_epi32(static_cast<int>(r_min(kp0 + j)));
        const __m512i hi = _mm512_set1_epi32(none ? 0 : static_cast<int>(r_max(kp0 + j)));
        for (int v = 0; v < kQV; ++v) {
          const __m512i r = _mm512_add_epi32(lane, _mm512_set1_epi32(row0(v)));
          const __mmask16 vis = _mm512_cmpge_epi32_mask(r, lo) & _mm512_cmplt_epi32_mask(r, hi);
          float* p = st + j * kBq + 16 * v;
          _mm512_store_ps(p, _mm512_mask_blend_ps(vis, neg_inf, _mm512_load_ps(p)));
        }
      }
    }

    // Online softmax in base 2 on c·S: the block's row max is c·max_j S (c > 0).
    __m512 mx[kQV], muse[kQV], sum[kQV];
    for (int v = 0; v < kQV; ++v) mx[v] = neg_inf;
    for (int j = 0; j < nkeys; ++j)
      for (int v = 0; v < kQV; ++v)
        mx[v] = _mm512_max_ps(mx[v], _mm512_load_ps(st + j * kBq + 16 * v));
    for (int v = 0; v < kQV; ++v) {
      // The running max is kept an integer (the ceiling), see the top of the file.
      mx[v] = _mm512_max_ps(
          m[v], _mm512_roundscale_ps(_mm512_mul_ps(c, mx[v]), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
      // Subtract 0 for rows that still see nothing, so their 2^(s - m) is 2^-inf = 0, not NaN.
      muse[v] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx[v], neg_inf, _CMP_EQ_OQ), mx[v],
                                     _mm512_setzero_ps());
      alpha[v] = cpu::exp2_ps(_mm512_sub_ps(m[v], muse[v]));  // an exact power of 2
      sum[v] = _mm512_setzero_ps();
    }
    // P = 2^(c·S - m), summed in f32 and packed to bf16 key pairs for PV (banded: only the
    // pairs PV reads).
    for (int i = 0; i < npairs; ++i) {
      const float* s0 = st + 2 * i * kBq;
      const bool second = 2 * i + 1 < nkeys;
      for (int v = 0; v < kQV; ++v) {
        if (banded && (i < pband[v].lo || i >= pband[v].hi)) continue;
        const __m512 e0 =
            cpu::exp2_weights_ps(_mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s0 + 16 * v)), muse[v]));
        const __m512 e1 =
            second ? cpu::exp2_weights_ps(_mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s0 + kBq + 16 * v)), muse[v]))
                   : _mm512_setzero_ps();
        sum[v] = _mm512_add_ps(sum[v], _mm512_add_ps(e0, e1));
        _mm512_store_si512(pp + i * kBq + 16 * v, pair_up(e0, e1));
      }
    }
    for (int v = 0; v < kQV; ++v) {
      l[v] = _mm512_fmadd_ps(l[v], alpha[v], sum[v]);
      m[v] = mx[v];
    }

    // Ot = α·Ot + Vᵀ·P. The first pair's even key is unseen when the window started on an odd
    // key; the last pair's odd key is past the block when nkeys is odd.
    const uint32_t keep_first = (j0 < range.lo) ? 0xffff0000u : 0xffffffffu;
    const __m512* pv_alpha = j0 == start ? nullptr : alpha;  // the first block starts Ot from 0
    const uint32_t keep_last = (nkeys % 2) ? 0x0000ffffu : 0xffffffffu;
    // PV by the vector micro-kernel over the key pairs [i, i + n), onto Ot scaled by a.
    auto pv_vectors = [&](int i, int n, uint32_t kf, uint32_t kl, const __m512* a) {
      for (int64_t d = 0; d < D; d += kNB)
        dispatch_nb<Tiles<QV>::template Pv, kNB>(static_cast<int>(std::min<int64_t>(kNB, D - d)),
                                                 pp + i * kBq, n, vb + i * D + d, D, kf, kl, a,
                                                 ot + d * kBq);
    };
    if (kAmx && !banded) {
#if SLOPE_AMX
      // The running max is an integer that settles after the first blocks: then every α is 1
      // and Ot is left as it is.
      __mmask16 settled = 0xffff;
      for (int v = 0; v < kQV; ++v)
        settled &= _mm512_cmp_ps_mask(alpha[v], _mm512_set1_ps(1.0f), _CMP_EQ_OQ);
      if (pv_alpha && settled != 0xffff)
        for (int64_t d = 0; d < D; ++d)
          for (int v = 0; v < kQV; ++v) {
            float* o = ot + d * kBq + 16 * v;
            _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), alpha[v]));
          }
      pv_amx_block<QV>(pp, npairs, kv, kvh, j0, std::max(j0, range.lo), j0 + nkeys, D,
                       !pv_alpha, ot, s.vte.get());
#endif
    } else if (!banded) {
      pv_vectors(0, npairs, keep_first, keep_last, pv_alpha);
    } else if constexpr (kBands) {
      for (int64_t d = 0; d < D; d += kNB)
        dispatch_nb<Tiles<QV>::template PvBands, kNB>(
            static_cast<int>(std::min<int64_t>(kNB, D - d)), pp, npairs, pseg, npseg, vb + d, D,
            keep_first, keep_last, pv_alpha, ot + d * kBq);
    }
  }

  // Finalise: out[i0 + r, h, :] = Ot[:][r] · factor, lse.
  finish_unit<kQV, kPacked>(ot, m, l, nrows, pb, h, i0);
}

// attend_block on the AMX tiles (amx) or on vdpbf16ps.
template <int QV, bool kPacked = false>
void attend_unit(bool amx, const Problem& pb, const PackedKv& kv, int64_t h, int64_t i0,
                 Scratch& s) {
  if (amx)
    attend_block<QV, kPacked, true>(pb, kv, h, i0, s);
  else
    attend_block<QV, kPacked>(pb, kv, h, i0, s);
}

// Diagonal window units. Under a causal window of W keys, row r of a unit (positions qa + r,
// r < 16) sees exactly the keys qa + r - W + 1 + j, j = 0 .. W - 1. With the rows in the lanes,
// lane r of "diagonal" j holds key b0 + r + j (b0 the key index of row 0's first visible key):
// every lane computes only its own W keys, where a block over the same rows computes W + 16
// (attend_block's head-packed units: 144 for 128). Row r's key for diagonal j is then a vector
// of 16 consecutive keys, from a layout with the keys in the lanes; PV then runs one row at a
// time, the row's probability pairs broadcast against V pairs with the head dims in the lanes.
// Both layouts are packed once per call (pack_diagonals):
//
//   QKᵀ, over d:  S[j][r]  += Qp[i][r] · Ks[i][b0 + r + j],   Ks[i][t] = (k[t,2i], k[t,2i+1])
//   PV,  over i:  O[r][d]  += Pp[i][r] · Vr[b0 + r + 2i][d],  Vr[t][d] = (v[t,d], v[t+1,d])
//
// A QKᵀ vector starting at b0 + j is cut from the two aligned ones at b0 + 16·⌊j/16⌋ by valignd
// (b0 - the layouts' first slot is a multiple of 16 in every unit), so the loads per vdpbf16ps
// are fewer than the block kernel's broadcasts. PV leaves each row's output in registers, so
// the output is written in place with no transpose. Each unit is one key block of W <= kMaxBk
// diagonals. The rounding is the block kernel's: q, k, v in bf16, the integer running max,
// bf16 probabilities, f32 sums; only the order of those sums differs (a row's V pairs start at
// its own first key instead of an even slot). Rows whose diagonals pass the call's keys (at the
// start of a sequence, or a ring's K/V block that holds part of a window) read zeros there,
// masked to probability 0; no row reads a key outside its window, so a NaN or Inf in a key no
// row may see stays out.
struct DiagKv {
  const uint32_t* ks;  // [Hkv][D/2][L]
  const uint32_t* vs;  // [Hkv][L][D]: Vr
  int64_t L;           // slots per row, a multiple of 16
  int64_t base;        // key index of slot 0 (may be negative: slots outside the keys are 0)
};

// Whether the head-packed units of this call run on the diagonals, and then (if layout is set)
// their layouts' extent in layout->base and layout->L: the call's visible keys, the slot before
// them (its Vs pair holds the first key) down to a unit's aligned start, and 16 slots past them
// (a unit reads up to 15 past its last row's key).
std::atomic<bool> g_diag{true};
bool diagonal_units(const Problem& pb, bool amx, DiagKv* layout = nullptr) {
  const int64_t W = pb.mask.window;
  if (amx || !g_diag.load(std::memory_order_relaxed) || !packs_heads(pb) || !pb.mask.causal ||
      W % 16 != 0 || W > kMaxBk || pb.D % 32 != 0)
    return false;
  const KeyRange used = visible_keys(pb.q_pos0, pb.q_pos0 + pb.nq - 1, pb.nk, pb.kv_pos0, pb.mask);
  if (used.lo >= used.hi) return false;
  if (layout) {
    const int64_t e = pb.q_pos0 - W + 1 - pb.kv_pos0;  // b0 of the unit at row 0
    layout->base = used.lo - 1 - (((used.lo - 1 - e) % 16) + 16) % 16;
    layout->L = (used.hi + 16 - layout->base + 15) / 16 * 16;
  }
  return true;
}

// One block of 16 slots t0 .. t0 + 15 of one KV head: k and v at the rows of keys t0 .. t0 + 16
// (the slot after the block's last pairs with its V), rows `stride` apart; ks at slot t0, rows
// L apart, and vs at slot t0 (slots D apart).
void pack_diagonal_block(const float* k, const float* v, int64_t stride, int64_t D,
                         uint32_t* ks, uint32_t* vs, int64_t L) {
  __m512 t[16];
  for (int64_t i0 = 0; i0 < D / 2; i0 += 16) {
    for (int j = 0; j < 16; ++j) {
      const float* r = k + j * stride + 2 * i0;
      t[j] = _mm512_castsi512_ps(bf16_pairs(_mm512_loadu_ps(r), _mm512_loadu_ps(r + 16)));
    }
    transpose16(t);
    for (int c = 0; c < 16; ++c) _mm512_store_ps(reinterpret_cast<float*>(ks + (i0 + c) * L), t[c]);
  }
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    __m512 x = _mm512_loadu_ps(v + d0);
    for (int j = 0; j < 16; ++j) {
      const __m512 y = _mm512_loadu_ps(v + (j + 1) * stride + d0);
      _mm512_store_si512(vs + j * D + d0, pair_up(x, y));
      x = y;
    }
  }
}

// Ks and Vs of dk's slots for each KV head (an omp for; keys outside 0 .. nk - 1 are 0). A block
// whose 17 keys all exist is read in place; the few others (a call's first and last) from a copy
// of their rows with zeros for the missing keys. Reading in place, with each V row loaded once,
// took the pack about 18% less time than per-row checks (docs/performance.md, twenty-third window).
//
// The blocks are split among the threads in key order (the KV heads of a block together), as the
// units are in row order (run_kernel): each thread packs, about, the keys of its own rows.
void pack_diagonals(const Problem& pb, const DiagKv& dk, uint32_t* ks, uint32_t* vs) {
  const int64_t D = pb.D, Dh = D / 2, L = dk.L, kvstride = pb.Hkv * D;
  std::vector<float> edge;  // [K, V][17][D]
#pragma omp for schedule(static)
  for (int64_t w = 0; w < L / 16 * pb.Hkv; ++w) {
    const int64_t t0 = w / pb.Hkv * 16, g = w % pb.Hkv;
    const int64_t key0 = dk.base + t0;
    uint32_t* const ksb = ks + g * Dh * L + t0;
    uint32_t* const vsb = vs + (g * L + t0) * D;
    if (key0 >= 0 && key0 + 16 < pb.nk) {
      pack_diagonal_block(pb.k + key0 * kvstride + g * D, pb.v + key0 * kvstride + g * D,
                          kvstride, D, ksb, vsb, L);
      continue;
    }
    edge.assign(2 * 17 * D, 0.0f);
    for (int64_t j = 0; j <= 16; ++j)
      if (key0 + j >= 0 && key0 + j < pb.nk) {
        std::memcpy(edge.data() + j * D, pb.k + (key0 + j) * kvstride + g * D, sizeof(float) * D);
        std::memcpy(edge.data() + (17 + j) * D, pb.v + (key0 + j) * kvstride + g * D, sizeof(float) * D);
      }
    pack_diagonal_block(edge.data(), edge.data() + 17 * D, D, D, ksb, vsb, L);
  }
}

// S rows S .. S + NJ - 1 of a span of 16 diagonals (S + NJ <= 16): ks at the span's first slot,
// rows (dim pairs) ksl apart.
template <int QV, int S, int NJ>
inline void qk_diagonals(const uint32_t* qp, const uint32_t* ks, int64_t ksl, int64_t Dh,
                         float* st, __m512 (&mx)[QV]) {
  constexpr int kBq = 16 * QV;
  __m512 acc[NJ][QV];
  for (int n = 0; n < NJ; ++n)
    for (int v = 0; v < QV; ++v) acc[n][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < Dh; ++i) {
    __m512bh q[QV];
    for (int v = 0; v < QV; ++v) q[v] = load_pairs(qp + i * kBq + 16 * v);
    const __m512i a = _mm512_load_si512(ks + i * ksl), b = _mm512_load_si512(ks + i * ksl + 16);
    [&]<int... n>(std::integer_sequence<int, n...>) {
      (
          [&] {
            const auto kv = (__m512bh)_mm512_alignr_epi32(b, a, S + n);
            for (int v = 0; v < QV; ++v) acc[n][v] = _mm512_dpbf16_ps(acc[n][v], kv, q[v]);
          }(),
          ...);
    }(std::make_integer_sequence<int, NJ>{});
  }
  for (int n = 0; n < NJ; ++n)
    for (int v = 0; v < QV; ++v) {
      _mm512_store_ps(st + (S + n) * kBq + 16 * v, acc[n][v]);
      mx[v] = _mm512_max_ps(mx[v], acc[n][v]);
    }
}

// out[i0 + r, h + v, d0 .. d0 + 16·ND) for v < QV: Σ_i Pp[i][16v + r] · Vr[b0 + r + 2i][d0 ..] over
// the W / 2 pairs of row r, times fac[v][r]; pr = pp + r, vr at (b0 + r, d0), slots D apart,
// orow at (i0 + r, h, d0) (on a 64-byte boundary for kStream: non-temporal stores). Not inlined:
// inside attend_diagonals GCC 12 spills its accumulators.
template <int QV, int ND, bool kStream>
__attribute__((noinline)) void pv_row(const uint32_t* pr, const uint32_t* vr, int64_t D, int64_t W,
                                      const float (&fac)[QV][16], int r, float* orow) {
  constexpr int kBq = 16 * QV;
  __m512 acc[QV][ND];
  for (int v = 0; v < QV; ++v)
    for (int n = 0; n < ND; ++n) acc[v][n] = _mm512_setzero_ps();
  for (int64_t i = 0; i < W / 2; ++i) {
    __m512bh vv[ND];
    for (int n = 0; n < ND; ++n) {
      vv[n] = (__m512bh)_mm512_load_si512(vr + 2 * i * D + 16 * n);
      // Kept in a register for the QV heads: GCC 12 otherwise loads it again for each.
      asm("" : "+v"(vv[n]));
    }
    for (int v = 0; v < QV; ++v) {
      const auto p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pr[i * kBq + 16 * v]));
      for (int n = 0; n < ND; ++n) acc[v][n] = _mm512_dpbf16_ps(acc[v][n], vv[n], p);
    }
  }
  for (int v = 0; v < QV; ++v) {
    const __m512 f = _mm512_set1_ps(fac[v][r]);
    for (int n = 0; n < ND; ++n) {
      if constexpr (kStream)
        _mm512_stream_ps(orow + v * D + 16 * n, _mm512_mul_ps(acc[v][n], f));
      else
        _mm512_storeu_ps(orow + v * D + 16 * n, _mm512_mul_ps(acc[v][n], f));
    }
  }
}

// PV and the finish of a diagonal unit (rows i0 .. i0 + nrows - 1 of heads h .. h + QV - 1):
// the probability pairs pp, vr at the slot of row 0's first key, the integer max m and sum l.
// Even rows first, then odd ones: each half reads the V pairs of one parity (18 KiB at W 128,
// head_dim 64). The output rows are written with non-temporal stores for kStream
// (streams_output), else prefetched for writing kAhead rows ahead. Whole window-128 calls ran
// 1.035-1.067x faster than with PV on the diagonals (0.99-1.04x without the prefetch), and
// streaming 1.040-1.049x faster than the prefetch (docs/performance.md, twenty-fourth window).
template <int QV, bool kStream>
void pv_rows(const uint32_t* pp, const uint32_t* vr, int64_t W, const __m512 (&m)[QV],
             const __m512 (&l)[QV], int nrows, const Problem& pb, int64_t h, int64_t i0) {
  constexpr int kAhead = 4;
  const int64_t D = pb.D, qstride = pb.Hq * D;
  alignas(64) float fac[QV][16];
  for (int v = 0; v < QV; ++v) {
    alignas(64) float mrow[16], lrow[16];
    _mm512_store_ps(mrow, m[v]);
    _mm512_store_ps(lrow, l[v]);
    block_factors<16>(mrow, lrow, nrows, pb, h + v, pb.lse + i0 * pb.Hq + h + v, fac[v]);
  }
  auto row = [](int k) { return k < 8 ? 2 * k : 2 * k - 15; };
  auto prefetch = [&](int k) {
    for (int v = 0; v < QV; ++v) prefetch_rows(pb.out, i0 + row(k), 1, pb, h + v, true);
  };
  if constexpr (!kStream)
    for (int k = 0; k < kAhead; ++k) prefetch(k);
  for (int k = 0; k < 16; ++k) {
    if constexpr (!kStream)
      if (k + kAhead < 16) prefetch(k + kAhead);
    const int r = row(k);
    if (r >= nrows) continue;
    float* orow = pb.out + (i0 + r) * qstride + h * D;
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) pv_row<QV, 4, kStream>(pp + r, vr + r * D + d0, D, W, fac, r, orow + d0);
    if (d0 < D) pv_row<QV, 2, kStream>(pp + r, vr + r * D + d0, D, W, fac, r, orow + d0);
  }
}

// Output bytes from which the diagonal units write the output with non-temporal stores (-1: the
// last-level cache's size).
std::atomic<int64_t> g_stream_bytes{-1};

// Whether this call's diagonal units stream their output rows past the cache (in each of its
// parts: run_kernel): its output is at least g_stream_bytes (by default the L3's size: it cannot
// all be in the cache when the call returns, so writing it through the cache reads each line from
// memory first for nothing) and every row of it starts on a 64-byte boundary (as the engine's
// tensors do). Smaller outputs are written through the cache, where the next op (the output
// projection, a ring's merge) reads them.
bool streams_output(const Problem& pb) {
  // 32 MiB where sysfs does not say.
  static const int64_t l3 = l3_cache_bytes() > 0 ? l3_cache_bytes() : int64_t{32} << 20;
  const int64_t from = g_stream_bytes.load(std::memory_order_relaxed);
  const int64_t bytes = pb.nq * pb.Hq * pb.D * int64_t{sizeof(float)};
  return bytes >= (from < 0 ? l3 : from) && reinterpret_cast<uintptr_t>(pb.out) % 64 == 0 &&
         pb.D % 16 == 0;
}

// A head-packed unit (rows i0 .. i0 + 15 of heads h .. h + QV - 1, as attend_block<QV, true>) on
// the diagonals of dk. `next` is the unit this thread likely takes next (nh = 0: none): its
// queries are prefetched during QKᵀ, and this unit's output rows during PV (pv_rows).
template <int QV>
void attend_diagonals(const Problem& pb, const DiagKv& dk, int64_t h, int64_t i0,
                      const HeadBlock& next, bool stream, Scratch& s) {
  constexpr int kBq = 16 * QV, kNJ = QV == 4 ? 4 : 8;
  const int64_t D = pb.D, Dh = D / 2, W = pb.mask.window;
  const int nrows = static_cast<int>(std::min<int64_t>(16, pb.nq - i0));
  const int64_t kvh = h / (pb.Hq / pb.Hkv);
  uint32_t* qp = s.qp.get();
  float* st = s.st.get();
  uint32_t* pp = s.pp.get();
  pack_queries<QV, true>(pb, h, i0, nrows, qp);

  // Key index of lane r's diagonal j: b0 + r + j.
  const int64_t b0 = pb.q_pos0 + i0 - W + 1 - pb.kv_pos0;
  const int64_t t0 = b0 - dk.base;
  const uint32_t* ks = dk.ks + kvh * Dh * dk.L + t0;
  const uint32_t* vs = dk.vs + (kvh * dk.L + t0) * D;
  int64_t stride = dk.L;
  if (t0 < 0 || t0 + W + 16 > dk.L) {
    // Slots before or past the layouts (the first rows of a sequence, a last partial unit):
    // the unit's W + 16 slots, 0 outside the layouts.
    stride = W + 16;
    uint32_t* sk = s.diag.get();
    uint32_t* sv = sk + Dh * stride;
    const int64_t lo = std::clamp<int64_t>(-t0, 0, stride), hi = std::clamp<int64_t>(dk.L - t0, lo, stride);
    for (int64_t i = 0; i < Dh; ++i) {
      std::memset(sk + i * stride, 0, sizeof(uint32_t) * stride);
      if (hi > lo) std::memcpy(sk + i * stride + lo, ks + i * dk.L + lo, sizeof(uint32_t) * (hi - lo));
    }
    std::memset(sv, 0, sizeof(uint32_t) * stride * D);
    if (hi > lo) std::memcpy(sv + lo * D, vs + lo * D, sizeof(uint32_t) * (hi - lo) * D);
    ks = sk;
    vs = sv;
  }

  // S = K·Qᵀ on the W diagonals, unscaled, and its max over them.
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 m[QV];
  for (int v = 0; v < QV; ++v) m[v] = neg_inf;
  for (int64_t t = 0; t < W; t += 16) {
    if (next.nh > 0) {
      const int r0 = static_cast<int>(16 * t / W), r1 = static_cast<int>(16 * (t + 16) / W);
      for (int v = 0; v < next.nh; ++v)
        prefetch_rows(pb.q, next.i0 + r0, r1 - r0, pb, next.h0 + v, false);
    }
    [&]<int... n>(std::integer_sequence<int, n...>) {
      (qk_diagonals<QV, n * kNJ, kNJ>(qp, ks + t, stride, Dh, st + t * kBq, m), ...);
    }(std::make_integer_sequence<int, 16 / kNJ>{});
  }
  // Lanes whose key is outside the call's keys see nothing there (and the max is taken again).
  if (b0 < 0 || b0 + 15 + W - 1 >= pb.nk) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int v = 0; v < QV; ++v) m[v] = neg_inf;
    for (int64_t j = 0; j < W; ++j) {
      const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(b0 + j)));
      const __mmask16 in = _mm512_cmpge_epi32_mask(key, _mm512_setzero_si512()) &
                           _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(static_cast<int>(pb.nk)));
      for (int v = 0; v < QV; ++v) {
        float* p = st + j * kBq + 16 * v;
        const __m512 x = _mm512_mask_blend_ps(in, neg_inf, _mm512_load_ps(p));
        _mm512_store_ps(p, x);
        m[v] = _mm512_max_ps(m[v], x);
      }
    }
  }

  // Softmax in base 2 on c·S, one block: m = ⌈c·max S⌉ (the block kernel's integer max).
  const __m512 c = _mm512_set1_ps(static_cast<float>(pb.scale * kLog2e));
  __m512 l[QV], muse[QV];
  for (int v = 0; v < QV; ++v) {
    m[v] = _mm512_roundscale_ps(_mm512_mul_ps(c, m[v]), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
    muse[v] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m[v], neg_inf, _CMP_EQ_OQ), m[v],
                                   _mm512_setzero_ps());
    l[v] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < W / 2; ++i) {
    const float* s0 = st + 2 * i * kBq;
    for (int v = 0; v < QV; ++v) {
      const __m512 e0 = cpu::exp2_weights_ps(
          _mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s0 + 16 * v)), muse[v]));
      const __m512 e1 = cpu::exp2_weights_ps(
          _mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s0 + kBq + 16 * v)), muse[v]));
      l[v] = _mm512_add_ps(l[v], _mm512_add_ps(e0, e1));
      _mm512_store_si512(pp + i * kBq + 16 * v, pair_up(e0, e1));
    }
  }

  if (stream)
    pv_rows<QV, true>(pp, vs, W, m, l, nrows, pb, h, i0);
  else
    pv_rows<QV, false>(pp, vs, W, m, l, nrows, pb, h, i0);
}

std::atomic<bool> g_amx{true};

// Whether this call runs QKᵀ and PV on AMX tiles.
bool uses_amx(const Problem& pb) {
  return g_amx.load(std::memory_order_relaxed) && pb.D % 32 == 0 && cpu::amx_usable();
}

// The engine calls attention once per layer per chunk, and fresh buffers would cost a page fault
// per 4 KiB written each time. Per thread, so that calls from several threads never share them.
struct KeptKv {
  GrowBuf<uint16_t> k16;  // [Hkv][slots + 16][D]
  GrowBuf<uint32_t> vp;   // [Hkv][slot pairs][D]
  GrowBuf<uint16_t> vt;   // [Hkv][D][slots up to 16] (AMX)
};
thread_local KeptKv kept_kv;

// Rows of a call whose units run on the diagonals taken at a time: each part packs the keys its
// rows see right before its units read them, so that they are still in the cache (Ks and Vs of
// 1024 rows and their windows: 1.8 MiB at 4 KV heads of head_dim 64). A whole window-128 call
// of 16K rows ran 1.02-1.15x faster in parts of 1024 rows (docs/performance.md, seventeenth and
// eighteenth windows); the rows and their results are the same.
constexpr int64_t kDiagonalRows = 1024;
static_assert(kDiagonalRows % kAttentionWindowVectorQ == 0, "parts start on a unit's rows");

// stream_output: whether the diagonal units write the output with non-temporal stores
// (streams_output), decided on the whole call's output, not on a part's.
void run_kernel(const Problem& pb, bool stream_output) {
  if (pb.nq > kDiagonalRows && diagonal_units(pb, uses_amx(pb))) {
    for (int64_t r0 = 0; r0 < pb.nq; r0 += kDiagonalRows) {
      Problem part = pb;
      part.q = pb.q + r0 * pb.Hq * pb.D;
      part.nq = std::min(kDiagonalRows, pb.nq - r0);
      part.q_pos0 = pb.q_pos0 + r0;
      part.out = pb.out + r0 * pb.Hq * pb.D;
      part.lse = pb.lse + r0 * pb.Hq;
      run_kernel(part, stream_output);
    }
    return;
  }
  const int64_t D = pb.D, kvstride = pb.Hkv * D, shift = pb.kv_pos0 & 1;
  const int64_t slots = pb.nk + shift, np = (slots + 1) / 2;
  // K and V in bf16, kept by the calling thread from call to call (KeptKv); the OpenMP
  // workers below write and read them through these pointers.
  KeptKv& kept = kept_kv;
  GrowBuf<uint16_t>& k16_buf = kept.k16;
  GrowBuf<uint32_t>& vp_buf = kept.vp;
  GrowBuf<uint16_t>& vt_buf = kept.vt;
  const bool amx = uses_amx(pb);
  const int qv = query_vectors(pb.mask), bq = 16 * qv;
  const bool packed = packs_heads(pb);
  // Head-packed units on the diagonals: their Ks and Vs in the buffers of K and V's pairs, which
  // the call then does not use.
  DiagKv dk{};
  const bool diag = packed && diagonal_units(pb, amx, &dk);
  const bool stream = diag && stream_output;
  uint32_t* const ks = diag ? reinterpret_cast<uint32_t*>(k16_buf.get(pb.Hkv * D * dk.L)) : nullptr;
  uint32_t* const vs = diag ? vp_buf.get(pb.Hkv * D * dk.L) : nullptr;
  dk.ks = ks;
  dk.vs = vs;
  // AMX's S tiles read up to 15 slots past a block's last key: a last head's may pass the end.
  uint16_t* const k16 = diag ? nullptr : k16_buf.get((slots + 16) * kvstride);
  // V in key pairs for the vector PV: without AMX, and for the band tiles of 32-row window
  // blocks, which stay on vdpbf16ps (with AMX every other block's PV runs on the tiles).
  const bool vector_pv = !diag && (!amx || (qv == kWindowQueryVectors && !packed));
  uint32_t* const vp = vector_pv ? vp_buf.get(pb.Hkv * np * D) : nullptr;
  const int64_t sp = (slots + 15) / 16 * 16;
  uint16_t* const vt = amx ? vt_buf.get(pb.Hkv * D * sp) : nullptr;
  const PackedKv kv{k16, slots, vp, np, shift, vt, sp};
  // Only the slots of keys some query sees (from an even slot) are filled: the blocks read no
  // other.
  KeyRange used = visible_keys(pb.q_pos0, pb.q_pos0 + pb.nq - 1, pb.nk, pb.kv_pos0, pb.mask);
  used.lo = (used.lo + shift) & ~int64_t{1};
  used.hi += shift;
  const int64_t nqb = (pb.nq + bq - 1) / bq;
  const HeadBlocks hb(pb);
  const int64_t tasks = packed ? hb.count() : nqb * pb.Hq;
  // The diagonal units in shares (UnitShares) of rows, which the pack's split by keys matches.
  cpu::UnitShares shares(diag ? omp_get_max_threads() : 0);
#pragma omp parallel
  {
    if (diag) shares.set(omp_get_thread_num(), omp_get_num_threads(), tasks);
    // K and V to bf16 once per call (each omp for ends in a barrier).
    if (diag) pack_diagonals(pb, dk, ks, vs);
#pragma omp for schedule(static)
    for (int64_t j = k16 ? used.lo : used.hi; j < used.hi; ++j)
      for (int64_t g = 0; g < pb.Hkv; ++g) {
        uint16_t* const dst = k16 + (g * slots + j) * D;
        if (j < shift)
          std::memset(dst, 0, sizeof(uint16_t) * D);
        else
          to_bf16(pb.k + (j - shift) * kvstride + g * D, D, dst);
      }
    if (vp) pack_v_pairs(pb.v, pb.nk, shift, pb.Hkv, D, used.lo / 2, (used.hi + 1) / 2, vp);
#if SLOPE_AMX
    const cpu::TileConfig tiles;
    if (amx) {
      pack_v_transposed(pb.v, pb.nk, shift, pb.Hkv, D, used.lo, used.hi, sp, vt);
      _tile_loadconfig(&tiles);
    }
#endif

    Scratch s(D);
    if (diag) {
      // In shares of rows (HeadBlocks::by_rows: all heads of 16 rows, then the next 16 rows),
      // so that a thread reads and writes whole rows of queries and output, and mostly the K/V
      // it packed itself. Each unit's successor is taken before the unit runs, so that the unit
      // prefetches its queries, spread through the unit rather than at its start (whole
      // window-128 calls 1.01-1.04x on the Zen 4: docs/performance.md, eighteenth window).
      // Whole window-128 calls ran 1.04-1.11x faster than in runs of 16 of one KV head handed
      // out dynamically (docs/performance.md, twenty-fifth window).
      shares.run(omp_get_thread_num(), [&](int64_t t, int64_t next) {
        const HeadBlock u = hb.by_rows(t);
        with_block_heads(u.nh, [&](auto nh) {
          attend_diagonals<nh()>(pb, dk, u.h0, u.i0, next >= 0 ? hb.by_rows(next) : HeadBlock{0, 0, 0}, stream, s);
        });
      });
    } else {
      // One KV head at a time (its K/V stay in the cache while all of its query heads and
      // blocks read them), later (longer) query blocks first, the GQA heads of a block together.
      const int64_t group = pb.Hq / pb.Hkv, per_kv_head = nqb * group;
      // Head-packed blocks: HeadBlocks' order, also one KV head at a time, in HeadBlocks::run's runs.
      const int64_t nthreads = omp_get_num_threads();
      const int64_t run = packed ? hb.run(nthreads) : 1;
      // The unit this thread likely takes next, for the prefetches.
      const int64_t ahead = run > 1 ? 1 : nthreads;
#pragma omp for schedule(dynamic, run)
      for (int64_t t = 0; t < tasks; ++t) {
        if (packed) {
          // On AMX these prefetches cost more than they hide: without them every alternated
          // window-128 call ran 4-10% faster, chunk calls and whole ones (docs/performance.md,
          // fifteenth window). Elsewhere they were measured in (Zen 4).
          if (!amx) prefetch_for_head_block(pb, hb, t, ahead);
          const HeadBlock u = hb.at(t);
          with_block_heads(u.nh, [&](auto nh) { attend_unit<nh(), true>(amx, pb, kv, u.h0, u.i0, s); });
          continue;
        }
        // Unit t: KV head t / per_kv_head; within it, query block nqb - 1 - u / group and query
        // head u % group of that KV head's group, u = t % per_kv_head.
        auto head = [&](int64_t w) { return w / per_kv_head * group + w % per_kv_head % group; };
        auto row0 = [&](int64_t w) { return (nqb - 1 - w % per_kv_head / group) * bq; };
        const int64_t h = head(t), i0 = row0(t), n = t + ahead;
        prefetch_for_block(pb, h, i0, bq, n < tasks ? head(n) : -1, row0(n));
        if (qv == kWindowQueryVectors)
          attend_unit<kWindowQueryVectors>(amx, pb, kv, h, i0, s);
        else
          attend_unit<kMaxQueryVectors>(amx, pb, kv, h, i0, s);
      }
    }
#if SLOPE_AMX
    if (amx) _tile_release();
#endif
    // Non-temporal stores are weakly ordered: this thread's are globally visible before the
    // region's closing barrier, and so before any thread reads the output.
    if (stream) _mm_sfence();
  }
}

#endif  // SLOPE_ATTENTION_BF16

// Logs `why` the first time it is called with that flag.
void say_once(std::atomic<bool>& said, const char* why) {
  if (!said.exchange(true)) slope::log(LogLevel::Warn, why);
}

}  // namespace

bool run_bf16(const Problem& pb) {
  static std::atomic<bool> said_cpu{false}, said_shape{false};
  if (!bf16_attention_supported()) {
    say_once(said_cpu,
             "bf16 attention: this CPU or this build lacks AVX512-BF16 (vdpbf16ps); attention "
             "runs the f32 kernel");
    return false;
  }
  if (pb.D % 2 != 0 || !(pb.scale > 0.0f) || !std::isfinite(pb.scale)) {
    say_once(said_shape,
             "bf16 attention: an odd head_dim or a scale that is not positive and finite; that "
             "attention runs the f32 kernel");
    return false;
  }
#if SLOPE_ATTENTION_BF16
  run_kernel(pb, streams_output(pb));
  return true;
#else
  return false;
#endif
}

int64_t bf16_kept_bytes() {
#if SLOPE_ATTENTION_BF16
  return kept_kv.k16.bytes() + kept_kv.vp.bytes() + kept_kv.vt.bytes();
#else
  return 0;
#endif
}

}  // namespace attention_detail

bool amx_attention_supported() { return bf16_attention_supported() && cpu::amx_usable(); }

void set_amx_attention(bool on) {
#if SLOPE_ATTENTION_BF16
  attention_detail::g_amx.store(on);
#else
  (void)on;
#endif
}

void set_diagonal_window_attention(bool on) {
#if SLOPE_ATTENTION_BF16
  attention_detail::g_diag.store(on);
#else
  (void)on;
#endif
}

void set_attention_stream_bytes(int64_t bytes) {
#if SLOPE_ATTENTION_BF16
  attention_detail::g_stream_bytes.store(bytes);
#else
  (void)bytes;
#endif
}

bool bf16_attention_supported() {
#if SLOPE_ATTENTION_BF16
  static const bool cpu_has = __builtin_cpu_supports("avx512bf16");
  return cpu_has;
#else
  return false;
#endif
}

}  // namespace slope::kernels
