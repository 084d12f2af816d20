// Issue 14, thirteenth window: could a hand-written AMX GEMM beat oneDNN's on the MoE's expert
// shapes? C[M, N] f32 = A[M, K] bf16 · B[K, N] bf16, B prepacked into 1 KiB tiles, 2 x 2 output
// tiles per step; v1-v7 differ in A's packing, the loop order, K-blocking (to keep one operand in
// L1) and software prefetch. Each variant is checked against a double-precision product, then
// timed (best of 5), with E experts' weights taken in turn.
//   g++ -O3 -march=native amx_gemm_probe.cpp -o amx_gemm_probe && ./amx_gemm_probe M N K E
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <omp.h>

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() { for (int t = 0; t < 8; ++t) { colsb[t] = 64; rows[t] = 16; } }
};

static uint16_t f2b(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float b2f(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; memcpy(&f, &u, 4); return f; }

// Bp layout: [N/16][K/32][16 pair-rows][16 cols][2]  (1 KiB per (n16, k32) tile)
void pack_b(const uint16_t* B, int K, int N, uint16_t* Bp) {
  for (int n16 = 0; n16 < N / 16; ++n16)
    for (int k32 = 0; k32 < K / 32; ++k32) {
      uint16_t* t = Bp + (size_t(n16) * (K / 32) + k32) * 512;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c)
          for (int p = 0; p < 2; ++p) t[r * 32 + c * 2 + p] = B[size_t(k32 * 32 + 2 * r + p) * N + n16 * 16 + c];
    }
}

// Variant 1: C block 32x32, A/B from L2, full K per block. M%32==0, N%32==0.
void gemm_v1(const uint16_t* A, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32;
  for (int n = 0; n < N; n += 32) {
    const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
    const uint16_t* b1 = b0 + size_t(KT) * 512;
    for (int m = 0; m < M; m += 32) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      const uint16_t* a0 = A + size_t(m) * K;
      const uint16_t* a1 = a0 + size_t(16) * K;
      for (int k = 0; k < KT; ++k) {
        _tile_loadd(4, a0 + k * 32, K * 2);
        _tile_loadd(6, b0 + k * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a1 + k * 32, K * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(7, b1 + k * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* c = C + size_t(m) * N + n;
      _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
      _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
    }
  }
}

// Variant 2: A packed per 32-row block as [K/32][2][16][32] so each A tile is 1 KiB contiguous
// (stride 64), m inner so B pair (2 KiB per k) is reused from L1 across... (same loop order as v1)
void pack_a(const uint16_t* A, int M, int K, uint16_t* Ap) {
  // [M/16][K/32][16][32]
  for (int m16 = 0; m16 < M / 16; ++m16)
    for (int k32 = 0; k32 < K / 32; ++k32)
      for (int r = 0; r < 16; ++r)
        memcpy(Ap + ((size_t(m16) * (K / 32) + k32) * 16 + r) * 32, A + size_t(m16 * 16 + r) * K + k32 * 32, 64);
}
void gemm_v2(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32;
  for (int n = 0; n < N; n += 32) {
    const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
    const uint16_t* b1 = b0 + size_t(KT) * 512;
    for (int m = 0; m < M; m += 32) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
      const uint16_t* a1 = a0 + size_t(KT) * 512;
      for (int k = 0; k < KT; ++k) {
        _tile_loadd(4, a0 + k * 512, 64);
        _tile_loadd(6, b0 + k * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a1 + k * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(7, b1 + k * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* c = C + size_t(m) * N + n;
      _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
      _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
    }
  }
}
// Variant 3: packed A, K split into chunks of KC so A chunk (M x KC) stays in L1; C accumulated
// through memory across chunks.
template <int KC>
void gemm_v3(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32;
  for (int kc = 0; kc < KT; kc += KC / 32) {
    for (int n = 0; n < N; n += 32) {
      const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
      const uint16_t* b1 = b0 + size_t(KT) * 512;
      for (int m = 0; m < M; m += 32) {
        float* c = C + size_t(m) * N + n;
        if (kc == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else { _tile_loadd(0, c, N * 4); _tile_loadd(1, c + 16, N * 4); _tile_loadd(2, c + 16 * N, N * 4); _tile_loadd(3, c + 16 * N + 16, N * 4); }
        const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
        const uint16_t* a1 = a0 + size_t(KT) * 512;
        for (int k = kc; k < kc + KC / 32; ++k) {
          _tile_loadd(4, a0 + k * 512, 64);
          _tile_loadd(6, b0 + k * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(5, a1 + k * 512, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_loadd(7, b1 + k * 512, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
        _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
      }
    }
  }
}
// Variant 4: C block 16 rows x 64 cols? no: 32 rows x 32 cols but n-loop inner for A reuse in L1:
// for m-block (32 rows, A panel 32xK = 64 KiB at K=1024): for n-block: ... A panel from L1/L2, B from L2/L3.
void gemm_v4(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32;
  for (int m = 0; m < M; m += 32) {
    const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
    const uint16_t* a1 = a0 + size_t(KT) * 512;
    for (int n = 0; n < N; n += 32) {
      const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
      const uint16_t* b1 = b0 + size_t(KT) * 512;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int k = 0; k < KT; ++k) {
        _tile_loadd(4, a0 + k * 512, 64);
        _tile_loadd(6, b0 + k * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a1 + k * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(7, b1 + k * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* c = C + size_t(m) * N + n;
      _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
      _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
    }
  }
}


// Variant 5: B block (Kc x 32 cols) in L1, all m-blocks inner; C through memory between K chunks.
template <int KC, bool PF>
void gemm_v5(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32, KS = KC / 32;
  for (int n = 0; n < N; n += 32) {
    const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
    const uint16_t* b1 = b0 + size_t(KT) * 512;
    for (int kc = 0; kc < KT; kc += KS) {
      for (int m = 0; m < M; m += 32) {
        float* c = C + size_t(m) * N + n;
        if (kc == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else { _tile_loadd(0, c, N * 4); _tile_loadd(1, c + 16, N * 4); _tile_loadd(2, c + 16 * N, N * 4); _tile_loadd(3, c + 16 * N + 16, N * 4); }
        const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
        const uint16_t* a1 = a0 + size_t(KT) * 512;
        for (int k = kc; k < kc + KS; ++k) {
          if (PF) {
            const char* pa = reinterpret_cast<const char*>(a0 + (k + 2) * 512);
            const char* pa1 = reinterpret_cast<const char*>(a1 + (k + 2) * 512);
            for (int l = 0; l < 1024; l += 64) { _mm_prefetch(pa + l, _MM_HINT_T0); _mm_prefetch(pa1 + l, _MM_HINT_T0); }
          }
          _tile_loadd(4, a0 + k * 512, 64);
          _tile_loadd(6, b0 + k * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(5, a1 + k * 512, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_loadd(7, b1 + k * 512, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
        _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
      }
    }
  }
}
// Variant 6: v2 with prefetch of next k-step's A and B tiles
template <int DIST>
void gemm_v6(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32;
  for (int n = 0; n < N; n += 32) {
    const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
    const uint16_t* b1 = b0 + size_t(KT) * 512;
    for (int m = 0; m < M; m += 32) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
      const uint16_t* a1 = a0 + size_t(KT) * 512;
      for (int k = 0; k < KT; ++k) {
        const char* p[4] = {reinterpret_cast<const char*>(a0 + (k + DIST) * 512), reinterpret_cast<const char*>(a1 + (k + DIST) * 512),
                            reinterpret_cast<const char*>(b0 + (k + DIST) * 512), reinterpret_cast<const char*>(b1 + (k + DIST) * 512)};
        for (int q = 0; q < 4; ++q) for (int l = 0; l < 1024; l += 64) _mm_prefetch(p[q] + l, _MM_HINT_T0);
        _tile_loadd(4, a0 + k * 512, 64);
        _tile_loadd(6, b0 + k * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a1 + k * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(7, b1 + k * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* c = C + size_t(m) * N + n;
      _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
      _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
    }
  }
}

// Variant 7: GotoBLAS order: kc chunk outer, m-block (A chunk 32 x KC in L1), n inner (B from L2, prefetched), C via memory.
template <int KC>
void gemm_v7(const uint16_t* Ap, int M, int K, const uint16_t* Bp, int N, float* C) {
  const int KT = K / 32, KS = KC / 32;
  for (int kc = 0; kc < KT; kc += KS)
    for (int m = 0; m < M; m += 32) {
      const uint16_t* a0 = Ap + size_t(m / 16) * KT * 512;
      const uint16_t* a1 = a0 + size_t(KT) * 512;
      for (int n = 0; n < N; n += 32) {
        const uint16_t* b0 = Bp + size_t(n / 16) * KT * 512;
        const uint16_t* b1 = b0 + size_t(KT) * 512;
        float* c = C + size_t(m) * N + n;
        if (kc == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else { _tile_loadd(0, c, N * 4); _tile_loadd(1, c + 16, N * 4); _tile_loadd(2, c + 16 * N, N * 4); _tile_loadd(3, c + 16 * N + 16, N * 4); }
        for (int k = kc; k < kc + KS; ++k) {
          const char* p0 = reinterpret_cast<const char*>(b0 + (k + 1) * 512);
          const char* p1 = reinterpret_cast<const char*>(b1 + (k + 1) * 512);
          for (int l = 0; l < 1024; l += 64) { _mm_prefetch(p0 + l, _MM_HINT_T0); _mm_prefetch(p1 + l, _MM_HINT_T0); }
          _tile_loadd(4, a0 + k * 512, 64);
          _tile_loadd(6, b0 + k * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(5, a1 + k * 512, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_loadd(7, b1 + k * 512, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, N * 4); _tile_stored(1, c + 16, N * 4);
        _tile_stored(2, c + 16 * N, N * 4); _tile_stored(3, c + 16 * N + 16, N * 4);
      }
    }
}

int main(int argc, char** argv) {
  const int M = argc > 1 ? atoi(argv[1]) : 128, N = argc > 2 ? atoi(argv[2]) : 2048, K = argc > 3 ? atoi(argv[3]) : 1024;
  const int E = argc > 4 ? atoi(argv[4]) : 1;
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { puts("no amx"); return 1; }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<uint16_t> A(size_t(M) * K), Ap(size_t(M) * K);
  for (auto& x : A) x = f2b(d(rng));
  std::vector<std::vector<uint16_t>> Bps(E);
  std::vector<uint16_t> B(size_t(K) * N);
  for (int e = 0; e < E; ++e) {
    for (auto& x : B) x = f2b(d(rng));
    Bps[e].resize(size_t(K) * N);
    pack_b(B.data(), K, N, Bps[e].data());
  }
  pack_a(A.data(), M, K, Ap.data());
  std::vector<float> C(size_t(M) * N);
  TileConfig cfg;
  _tile_loadconfig(&cfg);
  // check v1 against naive (last B)
  gemm_v1(A.data(), M, K, Bps[E - 1].data(), N, C.data());
  double maxerr = 0;
  for (int i = 0; i < M; i += 7)
    for (int j = 0; j < N; j += 13) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(b2f(A[size_t(i) * K + k])) * b2f(B[size_t(k) * N + j]);
      maxerr = std::max(maxerr, std::abs(s - C[size_t(i) * N + j]));
    }
  printf("v1 maxerr %.3g\n", maxerr);
  gemm_v3<256>(Ap.data(), M, K, Bps[E - 1].data(), N, C.data());
  maxerr = 0;
  for (int i = 0; i < M; i += 7)
    for (int j = 0; j < N; j += 13) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(b2f(A[size_t(i) * K + k])) * b2f(B[size_t(k) * N + j]);
      maxerr = std::max(maxerr, std::abs(s - C[size_t(i) * N + j]));
    }
  printf("v3 maxerr %.3g\n", maxerr);
  auto bench = [&](const char* name, auto fn) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      int iters = 0;
      for (; iters < 20; ++iters)
        for (int e = 0; e < E; ++e) fn(Bps[e].data());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (iters * E);
      best = std::min(best, s);
    }
    printf("%-8s M=%d N=%d K=%d E=%d  %.0f GFLOP/s\n", name, M, N, K, E, 2.0 * M * N * K / best * 1e-9);
  };
  bench("v1", [&](const uint16_t* bp) { gemm_v1(A.data(), M, K, bp, N, C.data()); });
  bench("v2", [&](const uint16_t* bp) { gemm_v2(Ap.data(), M, K, bp, N, C.data()); });
  bench("v3<128>", [&](const uint16_t* bp) { gemm_v3<128>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v3<256>", [&](const uint16_t* bp) { gemm_v3<256>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v3<512>", [&](const uint16_t* bp) { gemm_v3<512>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v4", [&](const uint16_t* bp) { gemm_v4(Ap.data(), M, K, bp, N, C.data()); });
  bench("v5<256>", [&](const uint16_t* bp) { gemm_v5<256,false>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v5<512>", [&](const uint16_t* bp) { gemm_v5<512,false>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v5<1024>", [&](const uint16_t* bp) { gemm_v5<1024,false>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v5p<512>", [&](const uint16_t* bp) { gemm_v5<512,true>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v6<1>", [&](const uint16_t* bp) { gemm_v6<1>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v6<2>", [&](const uint16_t* bp) { gemm_v6<2>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v6<4>", [&](const uint16_t* bp) { gemm_v6<4>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v7<256>", [&](const uint16_t* bp) { gemm_v7<256>(Ap.data(), M, K, bp, N, C.data()); });
  bench("v7<512>", [&](const uint16_t* bp) { gemm_v7<512>(Ap.data(), M, K, bp, N, C.data()); });
  _tile_release();
}
