// The arithmetic probe's inner loop: kChainAccumulators independent zmm accumulators (enough to
// cover FMA latency on Zen 4 and Zen 5), each taking `iters` dependent vfmadd231ps (32 FLOP) or,
// with kBf16 where the build has AVX512-BF16, vdpbf16ps (64 FLOP), with no memory traffic.
// Internal to kernels/cpu (bf16_units.cpp's start-up probe) and bench/peak.cpp.
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

namespace slope::kernels::cpu {

constexpr int kChainAccumulators = 24;

// The sum of the accumulators' lanes, for the caller to keep (so the chains are not optimised
// away).
template <bool kBf16>
inline float unit_chain(int64_t iters) {
  constexpr int kAcc = kChainAccumulators;
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-9f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#if defined(__AVX512BF16__)
  const __m512bh ab = _mm512_cvtne2ps_pbh(a, a), bb = _mm512_cvtne2ps_pbh(b, b);
#else
  static_assert(!kBf16, "no bf16 chain without AVX512-BF16");
#endif
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kAcc; ++i) {
#if defined(__AVX512BF16__)
      if constexpr (kBf16) {
        acc[i] = _mm512_dpbf16_ps(acc[i], ab, bb);
        continue;
      }
#endif
      acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}

}  // namespace slope::kernels::cpu

#endif
