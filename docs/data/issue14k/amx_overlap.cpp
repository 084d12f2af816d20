// Does the core overlap AMX tile products with independent AVX-512 work? (issue 14, eleventh
// window; README.md). A step is, by MODE: 0, tiles alone: one K tile load, four Q tile loads and
// four tdpbf16ps, twice (the QK of 16 keys x 64 queries, head_dim 64); 1, vectors alone: the bf16
// softmax's exp pass on NV vectors of L1 scores (load, scale, subtract, 2^x, sum, bf16 pairs,
// store); 2, both in one step, the tiles first; 3, both, a tile product between each 2 vectors.
// The step time of 2 or 3 near max(0, 1) means they overlap, near 0 + 1 that they run in turn.
// g++ -O2 -march=native amx_overlap.cpp -o amx_overlap; ./amx_overlap MODE NV
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct alignas(64) Cfg {
  uint8_t p = 1, s = 0, r[14] = {};
  uint16_t c[16] = {};
  uint8_t rows[16] = {};
  Cfg() {
    for (int t = 0; t < 8; ++t) c[t] = 64, rows[t] = 16;
  }
};

static inline __m512 exp2w(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
  x = _mm512_max_ps(lowest, x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(0.0136703f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0517450f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2416044f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6929729f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000035f));
  return _mm512_maskz_scalef_ps(keep, p, x);
}

int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  Cfg cfg;
  _tile_loadconfig(&cfg);
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0, nv = argc > 2 ? std::atoi(argv[2]) : 32;
  alignas(64) static uint16_t k[16 * 64], q[32 * 64 * 2];
  alignas(64) static float s[64 * 16 * 4], st[4 * 256];
  alignas(64) static uint32_t pp[64 * 16 * 2];
  for (auto& x : k) x = 0x3f80;
  for (auto& x : q) x = 0x3f80;
  for (int i = 0; i < 64 * 64; ++i) s[i] = -0.01f * (i % 97);
  const __m512 c = _mm512_set1_ps(0.18f), m = _mm512_set1_ps(1.0f);
  __m512 sum = _mm512_setzero_ps();
  const long steps = 1000000;
  auto tiles = [&](int part) {  // part 0 or 1 of the two d halves; 4 products each
    _tile_loadd(4, k + 32 * part, 128);
    _tile_loadd(5, q + part * 16 * 64 * 2, 256);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(5, q + part * 16 * 64 * 2 + 32, 256);
    _tile_dpbf16ps(1, 4, 5);
    _tile_loadd(5, q + part * 16 * 64 * 2 + 64, 256);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(5, q + part * 16 * 64 * 2 + 96, 256);
    _tile_dpbf16ps(3, 4, 5);
  };
  auto vecs = [&](int v0, int v1) {
    for (int v = v0; v < v1; v += 2) {
      const __m512 e0 = exp2w(_mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s + 16 * v)), m));
      const __m512 e1 = exp2w(_mm512_sub_ps(_mm512_mul_ps(c, _mm512_load_ps(s + 16 * v + 16)), m));
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      _mm512_store_si512(pp + 8 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < steps; ++i) {
    if (mode == 0 || mode == 2) tiles(0), tiles(1);
    if (mode == 1 || mode == 2) vecs(0, nv);
    if (mode == 3) {
      for (int p = 0; p < 8; ++p) {  // eight products, spread over the vectors
        const int a = nv * p / 8 / 2 * 2, b = nv * (p + 1) / 8 / 2 * 2;
        if (p % 4 == 0) _tile_loadd(4, k + 32 * (p / 4), 128);
        _tile_loadd(5, q + (p / 4) * 16 * 64 * 2 + 32 * (p % 4), 256);
        if (p % 4 == 0) _tile_dpbf16ps(0, 4, 5);
        if (p % 4 == 1) _tile_dpbf16ps(1, 4, 5);
        if (p % 4 == 2) _tile_dpbf16ps(2, 4, 5);
        if (p % 4 == 3) _tile_dpbf16ps(3, 4, 5);
        vecs(a, b);
      }
    }
  }
  _tile_stored(0, st, 64);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  alignas(64) float out[16];
  _mm512_store_ps(out, sum);
  std::printf("mode %d nv %d: %.2f ns per step (check %g %g)\n", mode, nv, sec / steps * 1e9,
              out[0], st[0]);
}
