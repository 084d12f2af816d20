#include "slope/kernels/moe.h"

// GCC 12 reports false 'may be used uninitialized' warnings inside AVX-512 intrinsics
// (_mm512_undefined_* in the headers, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "slope/core/error.h"
#include "slope/kernels/cpu/exp2_avx2.h"  // pow2n_ps
#include "slope/kernels/gemm.h"

namespace slope::kernels {

// ---------------------------------------------------------------- routing

void route_topk_softmax(const float* logits, int64_t n, int64_t E, int k, int32_t* ids,
                        float* weights) {
  SLOPE_CHECK(k >= 1 && k <= E, "route_topk_softmax: k = ", k, " must be in [1, ", E, "]");
#pragma omp parallel for schedule(static) if (n * E >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    // Insertion into a sorted list of k: strictly greater logits move ahead, so equal logits
    // keep the lower expert index first (deterministic tie rule).
    int filled = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float v = l[e];
      if (filled == k && !(v > l[id[k - 1]])) continue;
      int pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && v > l[id[pos - 1]]) {
        id[pos] = id[pos - 1];
        --pos;
      }
      id[pos] = int32_t(e);
    }
    // Softmax over the k selected logits only; id[0] holds the max.
    const double m = l[id[0]];
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += std::exp(double(l[id[j]]) - m);
    for (int j = 0; j < k; ++j) w[j] = float(std::exp(double(l[id[j]]) - m) / sum);
  }
}

// ---------------------------------------------------------------- grouping

ExpertGroups group_by_expert(const int32_t* ids, const float* weights, int64_t n, int k,
                             int64_t E) {
  ExpertGroups g;
  const int64_t slots = n * k;
  g.offsets.assign(E + 1, 0);
  for (int64_t s = 0; s < slots; ++s) {
    SLOPE_CHECK(ids[s] >= 0 && ids[s] < E, "group_by_expert: expert id ", ids[s], " at slot ", s,
                " is outside [0, ", E, ")");
    ++g.offsets[ids[s] + 1];
  }
  for (int64_t e = 0; e < E; ++e) g.offsets[e + 1] += g.offsets[e];
  g.token.resize(slots);
  g.weight.resize(slots);
  std::vector<int64_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t s = 0; s < slots; ++s) {  // slot order = token order: stable by token
    const int64_t r = next[ids[s]]++;
    g.token[r] = s / k;
    g.weight[r] = weights[s];
  }
  return g;
}

void gather_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) {
#pragma omp parallel for schedule(static) if (m * dim >= (1 << 15))
  for (int64_t r = 0; r < m; ++r)
    std::memcpy(dst + r * dim, src + rows[r] * dim, size_t(dim) * sizeof(float));
}

void gather_rows_bf16(const float* src, const int64_t* rows, int64_t m, int64_t dim, uint16_t* dst) {
#pragma omp parallel for schedule(static) if (m * dim >= (1 << 15))
  for (int64_t r = 0; r < m; ++r) to_bf16_serial(src + rows[r] * dim, dst + r * dim, dim);
}

namespace {

// d[j] += w · s[j], j < len: the one form of the weighted add, so that scatter_add_rows and
// combine_rows round alike.
inline void add_scaled(float* d, const float* s, float w, int64_t len) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) d[j] += w * s[j];
}

}  // namespace

void scatter_add_rows(const float* src, const int64_t* rows, const float* w, int64_t m,
                      int64_t dim, float* dst) {
  // Rows may repeat, so r stays serial; threads split the columns instead, which keeps the
  // summation order of every element the same as the serial loop.
  constexpr int64_t kCols = 256;
  const int64_t nchunks = (dim + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (m * dim >= (1 << 15) && nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t c0 = c * kCols, c1 = std::min(dim, c0 + kCols);
    for (int64_t r = 0; r < m; ++r) add_scaled(dst + rows[r] * dim + c0, src + r * dim + c0, w[r], c1 - c0);
  }
}

void combine_rows(const float* src, const int64_t* rows, const float* w, int64_t m, int64_t dim, float* dst) {
  if (m <= 0) return;
  // The rows of each destination row t, ascending: by_dst[start[t] .. start[t + 1]).
  int64_t n = 0;
  for (int64_t r = 0; r < m; ++r) {
    SLOPE_CHECK(rows[r] >= 0, "combine_rows: destination row ", rows[r], " at row ", r, " is negative");
    n = std::max(n, rows[r] + 1);
  }
  std::vector<int64_t> start(static_cast<size_t>(n + 1), 0), by_dst(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) ++start[rows[r] + 1];
  for (int64_t t = 0; t < n; ++t) start[t + 1] += start[t];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < m; ++r) by_dst[next[rows[r]]++] = r;
#pragma omp parallel for schedule(static) if (m * dim >= (1 << 15))
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = start[t]; i < start[t + 1]; ++i) {
      const int64_t r = by_dst[i];
      add_scaled(dst + t * dim, src + r * dim, w[r], dim);
    }
}

// ---------------------------------------------------------------- activations

namespace {

// The Cephes expf polynomial in r, highest power first: e^r = 1 + r + r^2 · p(r).
[[maybe_unused]] constexpr int kExpPolyTerms = 6;
[[maybe_unused]] constexpr float kExpPoly[kExpPolyTerms] = {1.9875691500e-4f, 1.3981999507e-3f,
                                                           8.3334519073e-3f, 4.1665795894e-2f,
                                                           1.6666665459e-1f, 5.0000001201e-1f};

#if defined(__AVX512F__)
// exp(x) for f32 lanes: x = n·ln2 + r, |r| <= ln2/2, exp(r) by the Cephes expf polynomial
// (about 1 ulp), then scaled by 2^n with vscalefps (which also gives 0 and inf at the ends).
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.f)), _mm512_set1_ps(-110.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// sigmoid(z) = 1 / (1 + exp(−z))
inline __m512 sigmoid512(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), z))));
}

inline __m512 swiglu_oai16(__m512 gate, __m512 up, __m512 alpha, __m512 limit) {
  gate = _mm512_min_ps(gate, limit);
  up = _mm512_max_ps(_mm512_min_ps(up, limit), _mm512_sub_ps(_mm512_setzero_ps(), limit));
  const __m512 glu = _mm512_mul_ps(gate, sigmoid512(_mm512_mul_ps(gate, alpha)));
  return _mm512_mul_ps(_mm512_add_ps(up, _mm512_set1_ps(1.f)), glu);
}
#elif defined(__AVX2__) && defined(__FMA__)
// exp512's polynomial on ymm lanes. AVX2 has no vscalefps, so 2^n is built from its exponent
// bits (cpu::pow2n_ps), which holds n in [-126, 127]: x is clamped to [-87.3, 88.3] (e^x from 1.2e-38 to 2.2e38).
// Past the clamp sigmoid is 1 or about 1e-38 instead of 0: below any f32 or bf16 tolerance
// of a GLU whose other factor is at most the limit.
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  return _mm256_mul_ps(p, cpu::pow2n_ps(n));
}

inline __m256 sigmoid256(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}

inline __m256 swiglu_oai8(__m256 gate, __m256 up, __m256 alpha, __m256 limit) {
  gate = _mm256_min_ps(gate, limit);
  up = _mm256_max_ps(_mm256_min_ps(up, limit), _mm256_sub_ps(_mm256_setzero_ps(), limit));
  const __m256 glu = _mm256_mul_ps(gate, sigmoid256(_mm256_mul_ps(gate, alpha)));
  return _mm256_mul_ps(_mm256_add_ps(up, _mm256_set1_ps(1.f)), glu);
}
#endif

inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// One row of swiglu_oai: g [2·I] interleaved gate/up -> o [I].
void swiglu_oai_row(const float* g, int64_t I, float alpha, float limit, float* o) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 va = _mm512_set1_ps(alpha), vl = _mm512_set1_ps(limit);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (; i < I; i += 16) {
    const int64_t left = std::min<int64_t>(16, I - i);
    const __mmask16 m_lo = left >= 8 ? 0xffff : __mmask16((1u << (2 * left)) - 1);
    const __mmask16 m_hi = left > 8 ? __mmask16((1u << (2 * (left - 8))) - 1) : 0;
    const __m512 a = _mm512_maskz_loadu_ps(m_lo, g + 2 * i);
    const __m512 b = _mm512_maskz_loadu_ps(m_hi, g + 2 * i + 16);
    const __m512 gate = _mm512_permutex2var_ps(a, even, b);
    const __m512 up = _mm512_permutex2var_ps(a, odd, b);
    _mm512_mask_storeu_ps(o + i, __mmask16((1u << left) - 1), swiglu_oai16(gate, up, va, vl));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 va = _mm256_set1_ps(alpha), vl = _mm256_set1_ps(limit);
  for (; i + 8 <= I; i += 8) {
    // g + 2i holds (gate, up) pairs: the even lanes of a and b are the gates, the odd the ups;
    // the shuffles leave them in 64-bit blocks 0, 2, 1, 3.
    const __m256 a = _mm256_loadu_ps(g + 2 * i), b = _mm256_loadu_ps(g + 2 * i + 8);
    const __m256 gate = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
    const __m256 up = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
    _mm256_storeu_ps(o + i, swiglu_oai8(gate, up, va, vl));
  }
#endif
  for (; i < I; ++i) {
    const float gate = std::min(g[2 * i], limit);
    const float up = std::clamp(g[2 * i + 1], -limit, limit);
    o[i] = (up + 1.0f) * (gate * sigmoid(gate * alpha));
  }
}

}  // namespace

void swiglu_oai(const float* gu, int64_t m, int64_t I, float alpha, float limit, float* out) {
#pragma omp parallel for schedule(static) if (m * I >= (1 << 14))
  for (int64_t r = 0; r < m; ++r) swiglu_oai_row(gu + r * 2 * I, I, alpha, limit, out + r * I);
}

void swiglu_oai_bf16(const float* gu, int64_t m, int64_t I, float alpha, float limit, uint16_t* out) {
  constexpr int64_t kBlock = 256;  // f32 results of one block stay in L1 until rounded
#pragma omp parallel for schedule(static) if (m * I >= (1 << 14))
  for (int64_t r = 0; r < m; ++r) {
    float tmp[kBlock];
    for (int64_t i0 = 0; i0 < I; i0 += kBlock) {
      const int64_t len = std::min(kBlock, I - i0);
      swiglu_oai_row(gu + r * 2 * I + 2 * i0, len, alpha, limit, tmp);
      to_bf16_serial(tmp, out + r * I + i0, len);
    }
  }
}

void silu_mul(const float* gate_up, int64_t m, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (m * I >= (1 << 14))
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate_up + r * 2 * I;
    const float* u = g + I;
    float* o = out + r * I;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i < I; i += 16) {
      const int64_t left = std::min<int64_t>(16, I - i);
      const __mmask16 mk = __mmask16((1u << left) - 1);
      const __m512 gv = _mm512_maskz_loadu_ps(mk, g + i);
      const __m512 uv = _mm512_maskz_loadu_ps(mk, u + i);
      _mm512_mask_storeu_ps(o + i, mk, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid512(gv)), uv));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= I; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid256(gv)), uv));
    }
#endif
    for (; i < I; ++i) o[i] = g[i] * sigmoid(g[i]) * u[i];
  }
}

}  // namespace slope::kernels
