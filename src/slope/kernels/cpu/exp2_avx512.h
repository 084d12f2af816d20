// Vectorised 2^x for the attention softmax (AVX-512). Internal to the CPU kernels.
//
// Range reduction: x = n + f with n = round(x), f in [-0.5, 0.5]; 2^f by a degree-6 polynomial
// (interpolation at Chebyshev nodes, max relative error 8e-8 in float Horner evaluation, i.e.
// about 1 ulp), then 2^n applied exactly by vscalefps. x below -125 (a masked score, -inf,
// among them) gives exactly 0 instead of a denormal: results under 2^-126 would be denormal or
// underflow, and each such vector costs a microcode assist (without FTZ, which the engine does
// not set) of the order of a hundred cycles; window blocks mask a tenth of their scores, and
// those assists took a third of a window call's time. A probability below 2^-125 of the row's
// largest weight (at least 1/2) is lost next to it in f32 anyway. The input is clamped at -125
// first so that -inf gives no NaN (f = -inf - -inf). NaN is neither clamped nor zeroed: vmaxps
// returns its second operand when either is NaN, so max(-125, x) passes a NaN x through, the
// unordered compare keeps it, and 2^NaN = NaN, as a reference softmax gives (a NaN score must
// poison its row, not become a weight of 0). Callers only pass x <= 0 (scores minus their
// running maximum) or NaN.
#pragma once

namespace slope::kernels::cpu {

// 2^f for f in [-0.5, 0.5], highest power first (Horner).
inline constexpr int kExp2PolyTerms = 7;
inline constexpr float kExp2Poly[kExp2PolyTerms] = {1.546144485e-04f, 1.340042800e-03f,
                                                     9.618056938e-03f, 5.550327152e-02f,
                                                     2.402265072e-01f, 6.931471825e-01f, 1.0f};

// The bf16 kernel's 2^x (exp2_weights_ps): 2^f for f in [0, 1), degree 4 (least squares on the
// relative error, reweighted toward minimax; max relative error 2.7e-6 in float Horner evaluation).
inline constexpr int kExp2WeightsPolyTerms = 5;
inline constexpr float kExp2WeightsPoly[kExp2WeightsPolyTerms] = {
    1.3534555211663246e-02f, 5.201190710067749e-02f, 2.414415180683136e-01f,
    6.930043697357178e-01f, 1.0000025033950806e+00f};

}  // namespace slope::kernels::cpu

#if defined(__AVX512F__)
#include <immintrin.h>

namespace slope::kernels::cpu {

inline __m512 exp2_ps(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);  // x >= -125 or NaN
  x = _mm512_max_ps(lowest, x);  // operand order: NaN x stays NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

#if defined(__AVX512DQ__)
// 2^x for the bf16 kernel's weights, which it rounds to bf16 (relative error up to 2^-9) for PV:
// exp2_ps's contract (x below -125 and -inf give exactly 0, never a denormal; NaN stays NaN) with
// relative error 2.7e-6 instead of 1e-7, in five operations fewer. x = floor(x) + f with f in
// [0, 1) from one vreduceps (rounding down), 2^f by a degree-4 polynomial, and 2^floor(x) applied
// by vscalefps, which takes the floor of its second operand itself. f is exact whenever x and
// x + k are both floats, for an integer k, and then the same for both, so 2^(x + k) is 2^x · 2^k
// exactly (whatever the polynomial), which the bf16 kernel's integer running max relies on.
// x is not clamped: a lane below -125 computes on whatever vreduceps gives it (NaN for -inf) and
// vscalefps's mask zeroes it; masked lanes cost no microcode assist (docs/performance.md).
inline __m512 exp2_weights_ps(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);  // or NaN
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(kExp2WeightsPoly[0]);
  for (int i = 1; i < kExp2WeightsPolyTerms; ++i)
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2WeightsPoly[i]));
  return _mm512_maskz_scalef_ps(keep, p, x);
}
#endif

}  // namespace slope::kernels::cpu

#endif
