#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
int main() {
  const size_t n = size_t(256) << 20;
  float* a = (float*)aligned_alloc(64, n); memset(a, 1, n);
  float* b = (float*)aligned_alloc(64, n); memset(b, 1, n);
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    __m512 s = _mm512_setzero_ps();
    for (size_t i = 0; i < n / 4; i += 16) s = _mm512_add_ps(s, _mm512_load_ps(a + i));
    double r = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    memcpy(b, a, n);
    double c = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("read %.1f GB/s, copy %.1f GB/s (%g)\n", n / r * 1e-9, 2 * n / c * 1e-9, _mm512_reduce_add_ps(s));
  }
}
