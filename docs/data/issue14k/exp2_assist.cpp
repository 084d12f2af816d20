// Do masked lanes of vscalefps cost a microcode assist? (issue 14, eleventh window; README.md)
// exp2_weights_ps's steps on vectors whose every fourth lane is V (the others -1 - i/1000), with
// (MAX 1) and without (MAX 0) the clamp at -125: for V below -125 the unclamped lanes would give
// a denormal 2^V if they were computed, but the keep mask zeroes them. Equal times for V = -1,
// -130, -140 and -inf mean no assist. g++ -O2 -march=native exp2_assist.cpp; ./a.out V MAX
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

template <bool kMax>
static inline __m512 e2(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
  if (kMax) x = _mm512_max_ps(lowest, x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.3390863314e-03f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6760317683e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503569543e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022106826e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192e+00f));
  return _mm512_maskz_scalef_ps(keep, p, _mm512_sub_ps(x, f));
}

int main(int argc, char** argv) {
  const float v = std::atof(argv[1]);
  const int mx = std::atoi(argv[2]);
  alignas(64) float s[1024];
  for (int i = 0; i < 1024; ++i) s[i] = (i % 4 == 0) ? v : -1.0f - 0.001f * i;
  __m512 acc = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 200000; ++r)
    for (int i = 0; i < 1024; i += 16) {
      const __m512 x = _mm512_load_ps(s + i);
      acc = _mm512_add_ps(acc, mx ? e2<true>(x) : e2<false>(x));
    }
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  alignas(64) float o[16];
  _mm512_store_ps(o, acc);
  std::printf("v %g max %d: %.3f ns/vector (%g)\n", v, mx, t / (200000.0 * 64) * 1e9, o[1]);
}
