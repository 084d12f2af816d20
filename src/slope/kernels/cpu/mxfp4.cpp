// MXFP4 dequantisation. A table of the 16 e2m1 values times 2^(s−127) for each of the 256
// scales is built once with ldexp (exact: every product is a power-of-two shift of a value with
// at most 2 significant bits; 6·2^128 and 2^128 overflow to inf exactly as ldexp does); each
// block is then 32 table lookups, done with one vpermps per 16 values.
#include "slope/kernels/mxfp4.h"

// GCC 12 reports false 'may be used uninitialized' warnings inside AVX-512 intrinsics
// (_mm512_undefined_* in the headers, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>

namespace slope::kernels {
namespace {

struct Table {
  alignas(64) float v[256][16];
  Table() {
    static const float fp4[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int s = 0; s < 256; ++s)
      for (int n = 0; n < 16; ++n) v[s][n] = std::ldexp(fp4[n], s - 127);
  }
};

const Table& table() {
  static const Table t;
  return t;
}

// One block: 16 bytes -> 32 floats, element 2j from the low nibble of byte j, 2j+1 the high.
inline void dequant_block(const uint8_t* b, const float* lut, float* out) {
#if defined(__AVX512F__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // nibbles of elements 0..15
  const __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // elements 16..31
  const __m512 t = _mm512_load_ps(lut);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(e0), t));
  _mm512_storeu_ps(out + 16, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(e1), t));
#else
  for (int j = 0; j < 16; ++j) {
    out[2 * j] = lut[b[j] & 0x0f];
    out[2 * j + 1] = lut[b[j] >> 4];
  }
#endif
}

}  // namespace

void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t nblocks,
                      float* out) {
  const Table& t = table();
  const int64_t total = rows * nblocks;
#pragma omp parallel for schedule(static) if (total >= 4096)
  for (int64_t i = 0; i < total; ++i) dequant_block(blocks + i * 16, t.v[scales[i]], out + i * 32);
}

}  // namespace slope::kernels
