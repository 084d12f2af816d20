// Single-thread timing of the diagonal units' K/V pack (a copy of pack_diagonals' loops).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "slope/kernels/cpu/attention_common.h"
using namespace slope::kernels::attention_detail;
inline __m512i bf16_pairs(__m512 a, __m512 b) { return (__m512i)_mm512_cvtne2ps_pbh(b, a); }
inline __m512i pair_up(__m512 a, __m512 b) {
  const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(il, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
int main(int argc, char** argv) {
  const int64_t nk = atol(argv[1]), L = atol(argv[2]), Hkv = 4, D = 64, Dh = 32, kvstride = Hkv * D;
  const int mode = atoi(argv[3]); const bool kout = argc > 4 && atoi(argv[4]); const int pfd = argc > 5 ? atoi(argv[5]) : 0;  // 0 full, 1 K only, 2 V only, 3 loads only
  std::vector<float> k(nk * kvstride, 0.5f), v(nk * kvstride, 0.25f);
  uint32_t* ks = (uint32_t*)aligned_alloc(64, Hkv * Dh * L * 4);
  uint32_t* vs = (uint32_t*)aligned_alloc(64, Hkv * D * L * 4);
  double best = 1e9, sum = 0;
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t base = (rep * L) % (nk - L - 17);
    auto t0c = std::chrono::steady_clock::now();
    __m512 sink = _mm512_setzero_ps();
    for (int64_t o1 = 0; o1 < (kout ? L / 16 : Hkv); ++o1)
      for (int64_t o2 = 0; o2 < (kout ? Hkv : L / 16); ++o2) {
        const int64_t g = kout ? o2 : o1, t0 = 16 * (kout ? o1 : o2);
        const int64_t key0 = base + t0;
        if (pfd > 0 && (!kout || g == 0))
          for (int j = 0; j < 16; ++j)
            for (const float* x : {k.data(), v.data()}) {
              const float* r = x + (key0 + 16 * pfd + j + 1) * kvstride + (kout ? 0 : g * D);
              for (int64_t b = 0; b < (kout ? kvstride : D); b += 16) asm volatile("prefetcht0 %0" : : "m"(r[b]));
            }
        __m512 t[16];
        if (mode != 2)
        for (int64_t i0 = 0; i0 < Dh; i0 += 16) {
          for (int j = 0; j < 16; ++j) {
            const float* r = k.data() + (key0 + j) * kvstride + g * D;
            t[j] = _mm512_castsi512_ps(bf16_pairs(_mm512_loadu_ps(r + 2 * i0), _mm512_loadu_ps(r + 2 * i0 + 16)));
          }
          if (mode == 3) { for (int j = 0; j < 16; ++j) sink = _mm512_add_ps(sink, t[j]); continue; }
          transpose16(t);
          for (int c = 0; c < 16; ++c) _mm512_store_ps(reinterpret_cast<float*>(ks + (g * Dh + i0 + c) * L + t0), t[c]);
        }
        if (mode != 1)
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
          __m512 x[17];
          for (int j = 0; j <= 16; ++j) x[j] = _mm512_loadu_ps(v.data() + (key0 + j) * kvstride + g * D + d0);
          if (mode == 3) { for (int j = 0; j < 16; ++j) sink = _mm512_add_ps(sink, x[j]); continue; }
          for (int j = 0; j < 16; ++j) t[j] = _mm512_castsi512_ps(pair_up(x[j], x[j + 1]));
          transpose16(t);
          for (int c = 0; c < 16; ++c) _mm512_store_ps(reinterpret_cast<float*>(vs + (g * D + d0 + c) * L + t0), t[c]);
        }
      }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0c).count();
    if (_mm512_reduce_add_ps(sink) == 1.2345f) std::puts("");
    best = std::min(best, s); sum += s;
  }
  const double blocks = Hkv * L / 16.0;
  std::printf("kout %d pf %d nk %ld L %ld mode %d: best %.1f us mean %.1f us, %.0f cycles per block best, %.0f mean\n", int(kout), pfd, long(nk), long(L), mode, best * 1e6, sum / 200 * 1e6, best * 3.65e9 / blocks, sum / 200 * 3.65e9 / blocks);
}
