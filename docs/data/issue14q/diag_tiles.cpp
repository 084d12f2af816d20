// The window unit's two products alone, one thread, operands in L1 (16 rows x 4 heads, head_dim
// 64): the key blocks' tiles (a broadcast K or V pair per 4 query vectors) over the 144 keys a
// unit computes for W = 128, against the diagonal tiles (two aligned loads per 16 keys, each
// diagonal's vector cut by valignd) over the 128 keys each row sees. GFLOP/s count every
// vdpbf16ps (64 FLOP); "per unit" is the time of QK + PV for one unit.
//   g++ -O3 -march=native -std=c++20 diag_tiles.cpp -o diag_tiles && taskset -c 0 ./diag_tiles
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
alignas(64) uint32_t qp[32][64];    // [dim pair][4 heads x 16 rows]
alignas(64) uint16_t k16[160][64];  // [key][D] bf16 (blocks)
alignas(64) uint32_t ks[32][176];   // [dim pair][key] (diagonals)
alignas(64) float st[160][64];
alignas(64) uint32_t pp[80][64];    // [key pair][lanes]
alignas(64) uint32_t vp[80][64];    // [key pair][D] (blocks)
alignas(64) uint32_t vs[64][176];   // [d][key] sliding pairs (diagonals)
alignas(64) float ot[64][64];
static inline __m512bh L(const void* p) { return (__m512bh)_mm512_load_si512(p); }
static inline __m512bh B(const void* p) { return (__m512bh)_mm512_set1_epi32(*(const int*)p); }

__attribute__((noinline)) void qk_block() {  // 144 keys, 6 a tile
  for (int j = 0; j < 144; j += 6) {
    __m512 acc[6][4];
    for (auto& a : acc) for (auto& x : a) x = _mm512_setzero_ps();
    for (int i = 0; i < 32; i++) {
      __m512bh q[4];
      for (int v = 0; v < 4; v++) q[v] = L(&qp[i][16 * v]);
      for (int n = 0; n < 6; n++) {
        const __m512bh kb = B(&k16[j + n][2 * i]);
        for (int v = 0; v < 4; v++) acc[n][v] = _mm512_dpbf16_ps(acc[n][v], q[v], kb);
      }
    }
    for (int n = 0; n < 6; n++) for (int v = 0; v < 4; v++) _mm512_store_ps(&st[j + n][16 * v], acc[n][v]);
  }
}
__attribute__((noinline)) void pv_block() {  // 72 key pairs, 6 dims a tile
  for (int d = 0; d < 64; d += 6) {
    const int nb = d + 6 <= 64 ? 6 : 4;
    __m512 acc[6][4];
    for (int n = 0; n < 6; n++) for (int v = 0; v < 4; v++) acc[n][v] = _mm512_load_ps(&ot[d + (n < nb ? n : 0)][16 * v]);
    for (int i = 0; i < 72; i++) {
      __m512bh p[4];
      for (int v = 0; v < 4; v++) p[v] = L(&pp[i][16 * v]);
      for (int n = 0; n < 6 && n < nb; n++) {
        const __m512bh vb = B(&vp[i][d + n]);
        for (int v = 0; v < 4; v++) acc[n][v] = _mm512_dpbf16_ps(acc[n][v], p[v], vb);
      }
    }
    for (int n = 0; n < nb; n++) for (int v = 0; v < 4; v++) _mm512_store_ps(&ot[d + n][16 * v], acc[n][v]);
  }
}
template <int S, int NJ>
inline void qk_diag_tile(int a0) {
  __m512 acc[NJ][4];
  for (auto& a : acc) for (auto& x : a) x = _mm512_setzero_ps();
  for (int i = 0; i < 32; i++) {
    __m512bh q[4];
    for (int v = 0; v < 4; v++) q[v] = L(&qp[i][16 * v]);
    const __m512i a = _mm512_load_si512(&ks[i][a0]), b = _mm512_load_si512(&ks[i][a0 + 16]);
    [&]<int... n>(std::integer_sequence<int, n...>) {
      ([&] {
        const auto kv = (__m512bh)_mm512_alignr_epi32(b, a, S + n);
        for (int v = 0; v < 4; v++) acc[n][v] = _mm512_dpbf16_ps(acc[n][v], q[v], kv);
      }(), ...);
    }(std::make_integer_sequence<int, NJ>{});
  }
  for (int n = 0; n < NJ; n++) for (int v = 0; v < 4; v++) _mm512_store_ps(&st[a0 + S + n][16 * v], acc[n][v]);
}
__attribute__((noinline)) void qk_diag() {  // 128 diagonals, 4 a tile
  for (int a0 = 0; a0 < 128; a0 += 16) {
    qk_diag_tile<0, 4>(a0); qk_diag_tile<4, 4>(a0); qk_diag_tile<8, 4>(a0); qk_diag_tile<12, 4>(a0);
  }
}
__attribute__((noinline)) void pv_diag() {  // 64 diagonal pairs, 4 dims a tile
  for (int d = 0; d < 64; d += 4) {
    __m512 acc[4][4];
    for (int n = 0; n < 4; n++) for (int v = 0; v < 4; v++) acc[n][v] = _mm512_load_ps(&ot[d + n][16 * v]);
    for (int a0 = 0; a0 < 128; a0 += 16) {
      __m512i a[4], b[4];
      for (int n = 0; n < 4; n++) { a[n] = _mm512_load_si512(&vs[d + n][a0]); b[n] = _mm512_load_si512(&vs[d + n][a0 + 16]); }
      [&]<int... j>(std::integer_sequence<int, j...>) {
        ([&] {
          __m512bh p[4];
          for (int v = 0; v < 4; v++) p[v] = L(&pp[a0 / 2 + j][16 * v]);
          for (int n = 0; n < 4; n++) {
            const auto vv = (__m512bh)_mm512_alignr_epi32(b[n], a[n], 2 * j);
            for (int v = 0; v < 4; v++) acc[n][v] = _mm512_dpbf16_ps(acc[n][v], p[v], vv);
          }
        }(), ...);
      }(std::make_integer_sequence<int, 8>{});
    }
    for (int n = 0; n < 4; n++) for (int v = 0; v < 4; v++) _mm512_store_ps(&ot[d + n][16 * v], acc[n][v]);
  }
}
template <class F>
double run(F f, double dps, const char* name) {
  for (int w = 0; w < 1000; w++) f();
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    const int n = 20000;
    for (int w = 0; w < n; w++) f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::printf("%-9s %7.1f ns a unit, %6.1f GFLOP/s\n", name, best * 1e9, dps * 64 / best * 1e-9);
  return best;
}
int main() {
  for (auto& r : qp) for (auto& x : r) x = 0x3f803f80u;
  const double qb = run(qk_block, 24 * 32 * 24.0, "qk_block"), pb = run(pv_block, 64 * 72 * 4.0, "pv_block");
  const double qd = run(qk_diag, 32 * 32 * 16.0, "qk_diag"), pd = run(pv_diag, 16 * 8 * 8 * 16.0, "pv_diag");
  std::printf("per unit: blocks %.1f ns (144 keys), diagonals %.1f ns (128 keys): %.2fx\n", (qb + pb) * 1e9,
              (qd + pd) * 1e9, (qb + pb) / (qd + pd));
}
