// Vectorised 2^x for the AVX2 attention softmax. Internal to the CPU kernels.
//
// The same contract and polynomial (kExp2Poly) as exp2_avx512.h, which explains them: x = n + f with
// n = round(x), 2^f by the degree-6 polynomial, x below -125 (a masked score, -inf, among them)
// gives exactly 0 and no denormal, and NaN passes through. AVX2 has no vscalefps, so 2^n is
// built from its exponent bits (pow2n_ps): exact for the n in [-125, 127] the clamp and the
// callers (x <= 0) leave. A NaN n converts to 0x80000000, whose shifted bits give 1.0, so the
// result is the polynomial's NaN.
#pragma once

#include "slope/kernels/cpu/exp2_avx512.h"  // kExp2Poly

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace slope::kernels::cpu {

// 2^n for integral n in [-126, 127] (AVX2 has no vscalefps): the exponent bits (n + 127) << 23.
inline __m256 pow2n_ps(__m256 n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

inline __m256 exp2_ps(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_NLT_UQ);  // x >= -125 or NaN
  x = _mm256_max_ps(lowest, x);  // operand order: NaN x stays NaN
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  return _mm256_and_ps(keep, _mm256_mul_ps(p, pow2n_ps(n)));
}

}  // namespace slope::kernels::cpu

#endif
