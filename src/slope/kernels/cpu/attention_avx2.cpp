// Flash attention on AVX2 + FMA (8-lane ymm) for CPUs without AVX-512 (Zen 2 and 3, Xeons
// before Skylake-SP): flash_attention's f32 kernel there, where the only other is the portable
// one (a double-precision loop, 50-100x slower).
//
// The contract is attention.cpp's (output + LSE, causal and window masks, sinks, GQA, global
// positions), with the same vertical online softmax over the query lanes and the same exp2
// (exp2_avx2.h), in a simpler shape. A query block is 16 positions (two ymm vectors) of one
// head; a work unit is up to 16 of them, the query heads of one KV group (up to 8) over two
// consecutive blocks of positions, against key blocks of 64, each key block loaded once for
// all of them: AVX2's 16 registers hold the 6 x 2 accumulators of a micro-kernel that broadcasts 6
// keys (QK) or 6 head dims (PV) against the two query vectors of a block. Sixteen positions is
// the window shape the planner counts (W + 15 keys per row under a window of W), so window units
// need no bands. Units of one head each ran causal 4K at 56 GFLOP/s with 16 heads over 4 KV heads
// against 108 with 4 over 1 (Zen 3): each unit streamed its K/V again. For the same reason a
// unit takes two blocks of positions: with one, a unit read the whole prefix's K/V (16 MB at 32K
// with one KV head of 64 dims) for 16 positions, and causal 32K ran at 0.8-0.9 of the 4K rate.
// With two, 4 heads over 1 ran 1.07-1.10x faster at 32K and 1.05-1.09x at 16K on two threads,
// 8 over 1 (gpt-oss-120b's group) 1.02-1.07x at 16K and 32K, all within 2% at 4K; four blocks
// for 4 heads gained no more (Zen 3, docs/performance.md). K and V are read head-major
// (HeadMajorKv). The rows' LSE and factor are finalised one at a time in double (finish_row):
// O(1) per row against O(D · keys) for the unit.
#include <algorithm>
#include <cstring>

#include <omp.h>

#include "slope/kernels/cpu/attention_common.h"
#include "slope/kernels/cpu/exp2_avx2.h"

namespace slope::kernels::attention_detail {

#if defined(__AVX2__) && defined(__FMA__)
namespace {

constexpr int kRows = 16;  // query rows of a block: two vectors
constexpr int kKeys = 64;  // keys of a block
constexpr int kNB = 6;     // keys (QK) or head dims (PV) per micro-kernel step
constexpr int kMaxHeads = 8;  // query heads of one KV group in a unit
constexpr int kBlocks = 2;  // blocks of kRows positions in a unit (fewer at the end of the queries)
// (block, head) pairs of a unit: each one's queries, running state and output.
constexpr int kMaxSlots = kMaxHeads * kBlocks;

// st[b][0..15] = Σ_d k[b, d] · qt[d][0..15] for NB keys, k rows kstride apart.
template <int NB>
struct Qk {
  static void run(const float* qt, const float* k, int64_t kstride, int64_t D, float* st) {
    __m256 acc[NB][2];
    for (int b = 0; b < NB; ++b) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m256 q0 = _mm256_load_ps(qt + d * kRows), q1 = _mm256_load_ps(qt + d * kRows + 8);
      for (int b = 0; b < NB; ++b) {
        const __m256 kb = _mm256_broadcast_ss(k + b * kstride + d);
        acc[b][0] = _mm256_fmadd_ps(kb, q0, acc[b][0]);
        acc[b][1] = _mm256_fmadd_ps(kb, q1, acc[b][1]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      _mm256_store_ps(st + b * kRows, acc[b][0]);
      _mm256_store_ps(st + b * kRows + 8, acc[b][1]);
    }
  }
};

// ot[b][·] = α · ot[b][·] + Σ_j v[j, b] · pt[j][·] for NB head dims b, v rows vstride apart;
// alpha null: ot starts from 0 (the first key block; ot is not read).
template <int NB>
struct Pv {
  static void run(const float* pt, int nkeys, const float* v, int64_t vstride, const __m256* alpha,
                  float* ot) {
    __m256 acc[NB][2];
    for (int b = 0; b < NB; ++b)
      for (int q = 0; q < 2; ++q)
        acc[b][q] = alpha ? _mm256_mul_ps(_mm256_load_ps(ot + b * kRows + 8 * q), alpha[q])
                          : _mm256_setzero_ps();
    for (int j = 0; j < nkeys; ++j) {
      const __m256 p0 = _mm256_load_ps(pt + j * kRows), p1 = _mm256_load_ps(pt + j * kRows + 8);
      const float* vj = v + j * vstride;
      for (int b = 0; b < NB; ++b) {
        const __m256 vb = _mm256_broadcast_ss(vj + b);
        acc[b][0] = _mm256_fmadd_ps(vb, p0, acc[b][0]);
        acc[b][1] = _mm256_fmadd_ps(vb, p1, acc[b][1]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      _mm256_store_ps(ot + b * kRows, acc[b][0]);
      _mm256_store_ps(ot + b * kRows + 8, acc[b][1]);
    }
  }
};

// t[r][c] -> t[c][r] for an 8 x 8 tile.
inline void transpose8(__m256 (&t)[8]) {
  __m256 u[8], w[8];
  for (int i = 0; i < 8; i += 2) {
    u[i] = _mm256_unpacklo_ps(t[i], t[i + 1]);
    u[i + 1] = _mm256_unpackhi_ps(t[i], t[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    w[i] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    w[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    w[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    w[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(w[i], w[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(w[i], w[i + 4], 0x31);
  }
}

// Per-thread scratch for up to kMaxSlots query blocks: each one's transposed pre-scaled queries
// [D][16] and running numerator [D][16], and one key block's scores, then probabilities [64][16].
class Scratch {
 public:
  explicit Scratch(int64_t D) : D_(D), buf_(alloc<float>((2 * kMaxSlots * D + kKeys) * kRows)) {}
  float* qt(int slot) const { return buf_.get() + slot * D_ * kRows; }
  float* ot(int slot) const { return buf_.get() + (kMaxSlots + slot) * D_ * kRows; }
  float* st() const { return buf_.get() + 2 * kMaxSlots * D_ * kRows; }

 private:
  int64_t D_;
  Buf<float> buf_;
};

// K and V head-major, [Hkv][nk][D]: row j of KV head g at g · head_stride + j · D. The rows of
// one head lie Hkv · D floats apart in the [nk, Hkv, D] input, and a key block of them falls into
// few L1 sets (64 rows 1 KB apart at 4 heads of 64 dims share 16 of the 64 sets); measured on a
// Zen 3, causal 4K ran at 80 GFLOP/s with 16 heads over 4 KV heads against 109 with 4 over 1;
// packed once per call, 93-95 against 58-66 unpacked in one (busy) run. With one KV head the
// input is already head-major.
struct HeadMajorKv {
  const float* k;
  const float* v;
  int64_t head_stride;
};

// One query block of a unit: rows i0 .. i0 + nrows - 1 (nrows <= 16) of one head, the first at
// global position qa, the keys it sees, and whether a key block has reached it yet.
struct Slot {
  int64_t i0, qa;
  int nrows;
  KeyRange keys;
  bool started;
};

// A work unit: the nh heads h0 .. h0 + nh - 1, which share one KV head, over the nb blocks of
// query rows from i0 (the last one shorter at the end of the queries); slot b · nh + hh is head
// h0 + hh at rows i0 + 16 b. Each key block is loaded once for all the slots.
void attend_unit(const Problem& pb, const HeadMajorKv& kv, int64_t h0, int nh, int64_t i0, int nb,
                 const Scratch& s) {
  const int64_t D = pb.D;
  const int64_t kvh = h0 / (pb.Hq / pb.Hkv);
  const int64_t qstride = pb.Hq * D;
  const int ns = nh * nb;
  Slot slot[kMaxSlots];
  KeyRange range{pb.nk, 0};  // the keys any slot sees
  for (int sl = 0; sl < ns; ++sl) {
    Slot& z = slot[sl];
    z.i0 = i0 + kRows * (sl / nh);
    z.qa = pb.q_pos0 + z.i0;
    z.nrows = static_cast<int>(std::min<int64_t>(kRows, pb.nq - z.i0));
    z.keys = visible_keys(z.qa, z.qa + z.nrows - 1, pb.nk, pb.kv_pos0, pb.mask);
    z.started = false;
    if (z.keys.lo < z.keys.hi) range = {std::min(range.lo, z.keys.lo), std::max(range.hi, z.keys.hi)};
  }

  // Qt[d][r] = q[i0 + r, h, d] · scale · log2 e, padded rows 0, in 8 x 8 tiles (the head dims
  // past a multiple of 8 one at a time).
  const float qscale = static_cast<float>(pb.scale * kLog2e);
  const int64_t D8 = D / 8 * 8;
  for (int sl = 0; sl < ns; ++sl) {
    float* qt = s.qt(sl);
    const int nrows = slot[sl].nrows;
    const float* qh = pb.q + slot[sl].i0 * qstride + (h0 + sl % nh) * D;
    for (int r0 = 0; r0 < kRows; r0 += 8) {
      for (int64_t d0 = 0; d0 < D8; d0 += 8) {
        __m256 t[8];
        for (int r = 0; r < 8; ++r)
          t[r] = r0 + r < nrows
                     ? _mm256_mul_ps(_mm256_loadu_ps(qh + (r0 + r) * qstride + d0), _mm256_set1_ps(qscale))
                     : _mm256_setzero_ps();
        transpose8(t);
        for (int c = 0; c < 8; ++c) _mm256_store_ps(qt + (d0 + c) * kRows + r0, t[c]);
      }
      for (int r = r0; r < r0 + 8; ++r)
        for (int64_t d = D8; d < D; ++d) qt[d * kRows + r] = r < nrows ? qh[r * qstride + d] * qscale : 0.0f;
    }
  }

  const __m256 neg_inf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 m[kMaxSlots][2], l[kMaxSlots][2];
  for (int sl = 0; sl < ns; ++sl)
    for (int v = 0; v < 2; ++v) m[sl][v] = neg_inf, l[sl][v] = zero;
  float* st = s.st();

  for (int64_t j0 = range.lo; j0 < range.hi; j0 += kKeys) {
    const int nkeys = static_cast<int>(std::min<int64_t>(kKeys, range.hi - j0));
    const float* kb = kv.k + kvh * kv.head_stride + j0 * D;
    const float* vb = kv.v + kvh * kv.head_stride + j0 * D;
    const int64_t kp0 = pb.kv_pos0 + j0;

    for (int sl = 0; sl < ns; ++sl) {
      Slot& z = slot[sl];
      // This slot's keys of the block: ja .. jb - 1.
      const int ja = static_cast<int>(std::max<int64_t>(z.keys.lo - j0, 0));
      const int jb = static_cast<int>(std::min<int64_t>(z.keys.hi - j0, nkeys));
      if (ja >= jb) continue;
      const int nrows = z.nrows;
      const float* qt = s.qt(sl);
      float* ot = s.ot(sl);

      // Key j (position kp) is visible to rows r_min(kp) <= r < r_max(kp) (attention.cpp).
      auto r_min = [&](int64_t kp) {
        return pb.mask.causal ? std::clamp<int64_t>(kp - z.qa, 0, kRows) : int64_t{0};
      };
      auto r_max = [&](int64_t kp) {
        return pb.mask.window > 0 ? std::clamp<int64_t>(kp + pb.mask.window - z.qa, 0, kRows)
                                  : int64_t{kRows};
      };
      const bool full = r_min(kp0 + jb - 1) == 0 && r_max(kp0 + ja) >= nrows;

      // S = K·Qt for this slot's keys of the block.
      for (int j = ja; j < jb; j += kNB)
        dispatch_nb<Qk, kNB>(std::min(kNB, jb - j), qt, kb + j * D, D, D, st + j * kRows);

      // Mask the keys at the diagonal and the window edge.
      if (!full) {
        for (int j = ja; j < jb; ++j) {
          const int64_t lo = r_min(kp0 + j), hi = r_max(kp0 + j);
          if (lo == 0 && hi >= nrows) continue;
          const __m256i lo1 = _mm256_set1_epi32(static_cast<int>(lo) - 1);
          const __m256i hiv = _mm256_set1_epi32(static_cast<int>(hi));
          for (int v = 0; v < 2; ++v) {
            const __m256i r = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * v));
            const __m256 vis = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_cmpgt_epi32(r, lo1), _mm256_cmpgt_epi32(hiv, r)));
            float* p = st + j * kRows + 8 * v;
            _mm256_store_ps(p, _mm256_blendv_ps(neg_inf, _mm256_load_ps(p), vis));
          }
        }
      }

      // Online softmax update over the query lanes.
      __m256 mx[2] = {m[sl][0], m[sl][1]}, muse[2], sum[2], alpha[2];
      for (int j = ja; j < jb; ++j)
        for (int v = 0; v < 2; ++v)
          mx[v] = _mm256_max_ps(mx[v], _mm256_load_ps(st + j * kRows + 8 * v));
      for (int v = 0; v < 2; ++v) {
        // Subtract 0 for rows that still see nothing, so their 2^(s - m) is 2^-inf = 0, not NaN.
        muse[v] = _mm256_blendv_ps(mx[v], zero, _mm256_cmp_ps(mx[v], neg_inf, _CMP_EQ_OQ));
        alpha[v] = cpu::exp2_ps(_mm256_sub_ps(m[sl][v], muse[v]));
        sum[v] = zero;
      }
      for (int j = ja; j < jb; ++j)
        for (int v = 0; v < 2; ++v) {
          float* p = st + j * kRows + 8 * v;
          const __m256 e = cpu::exp2_ps(_mm256_sub_ps(_mm256_load_ps(p), muse[v]));
          _mm256_store_ps(p, e);
          sum[v] = _mm256_add_ps(sum[v], e);
        }
      for (int v = 0; v < 2; ++v) {
        l[sl][v] = _mm256_fmadd_ps(l[sl][v], alpha[v], sum[v]);
        m[sl][v] = mx[v];
      }

      // Ot = α·Ot + Vᵀ·P; the slot's first block starts Ot from 0.
      const __m256* pv_alpha = z.started ? alpha : nullptr;
      z.started = true;
      for (int64_t d = 0; d < D; d += kNB)
        dispatch_nb<Pv, kNB>(static_cast<int>(std::min<int64_t>(kNB, D - d)), st + ja * kRows, jb - ja,
                             vb + ja * D + d, D, pv_alpha, ot + d * kRows);
    }
  }

  // Finalise: out[i0 + r, h, :] = Ot[:][r] · factor, lse. A slot no key block reached (it sees
  // no key) has Ot = 0.
  for (int sl = 0; sl < ns; ++sl) {
    const int64_t h = h0 + sl % nh, i0s = slot[sl].i0;
    const int nrows = slot[sl].nrows;
    float* ot = s.ot(sl);
    if (!slot[sl].started) std::memset(ot, 0, sizeof(float) * D * kRows);
    alignas(32) float mv[kRows], lv[kRows];
    for (int v = 0; v < 2; ++v) {
      _mm256_store_ps(mv + 8 * v, m[sl][v]);
      _mm256_store_ps(lv + 8 * v, l[sl][v]);
    }
    alignas(32) float factor[kRows];
    for (int r = 0; r < nrows; ++r) {
      const RowFinal f = finish_row(mv[r], lv[r], pb.sinks, h);
      factor[r] = f.out_factor;
      pb.lse[(i0s + r) * pb.Hq + h] = f.lse;
    }
    float* oh = pb.out + i0s * qstride + h * D;
    for (int r0 = 0; r0 < nrows; r0 += 8) {
      for (int64_t d0 = 0; d0 < D8; d0 += 8) {
        __m256 t[8];
        for (int c = 0; c < 8; ++c) t[c] = _mm256_load_ps(ot + (d0 + c) * kRows + r0);
        transpose8(t);
        for (int r = 0; r < 8 && r0 + r < nrows; ++r)
          _mm256_storeu_ps(oh + (r0 + r) * qstride + d0, _mm256_mul_ps(t[r], _mm256_set1_ps(factor[r0 + r])));
      }
      for (int r = r0; r < std::min(r0 + 8, nrows); ++r)
        for (int64_t d = D8; d < D; ++d) oh[r * qstride + d] = ot[d * kRows + r] * factor[r];
    }
  }
}

}  // namespace

thread_local GrowBuf<float> kept_k, kept_v;  // the head-major copies of K and V

bool run_avx2(const Problem& pb) {
  const int64_t D = pb.D;
  // Units: up to kMaxHeads heads of one KV group (a group of more takes ceil(group /
  // kMaxHeads) near-equal chunks) over a span of kBlocks blocks of 16 positions; one KV head at
  // a time (its K/V stay in the cache while its units read them), later (longer) spans first.
  const int64_t group = pb.Hq / pb.Hkv, chunks = (group + kMaxHeads - 1) / kMaxHeads;
  const int64_t nqb = (pb.nq + kRows - 1) / kRows, nspans = (nqb + kBlocks - 1) / kBlocks;
  const int64_t per_kv_head = nspans * chunks, tasks = per_kv_head * pb.Hkv;
  // The head-major copies (with one KV head, none), kept by the calling thread (GrowBuf).
  const bool pack = pb.Hkv > 1;
  GrowBuf<float>&k_buf = kept_k, &v_buf = kept_v;
  float* const kp = pack ? k_buf.get(pb.Hkv * pb.nk * D) : nullptr;
  float* const vp = pack ? v_buf.get(pb.Hkv * pb.nk * D) : nullptr;
  const HeadMajorKv kv{pack ? kp : pb.k, pack ? vp : pb.v, pb.nk * D};
  // Only the keys some query sees are packed: the units read no other.
  const KeyRange used = visible_keys(pb.q_pos0, pb.q_pos0 + pb.nq - 1, pb.nk, pb.kv_pos0, pb.mask);
#pragma omp parallel
  {
    if (pack) {
#pragma omp for schedule(static)
      for (int64_t j = used.lo; j < used.hi; ++j)
        for (int64_t g = 0; g < pb.Hkv; ++g) {
          const int64_t from = (j * pb.Hkv + g) * D, to = g * kv.head_stride + j * D;
          std::memcpy(kp + to, pb.k + from, sizeof(float) * D);
          std::memcpy(vp + to, pb.v + from, sizeof(float) * D);
        }
    }
    const Scratch s(D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = t / per_kv_head, u = t % per_kv_head;
      const int64_t span = nspans - 1 - u / chunks, c = u % chunks;
      const int64_t a = c * group / chunks, e = (c + 1) * group / chunks;  // heads [a, e) of g
      const int64_t b0 = span * kBlocks;  // the span's first block
      attend_unit(pb, kv, g * group + a, static_cast<int>(e - a), b0 * kRows,
                  static_cast<int>(std::min<int64_t>(kBlocks, nqb - b0)), s);
    }
  }
  return true;
}

int64_t avx2_kept_bytes() { return kept_k.bytes() + kept_v.bytes(); }

#else

bool run_avx2(const Problem&) { return false; }
int64_t avx2_kept_bytes() { return 0; }

#endif

}  // namespace slope::kernels::attention_detail
