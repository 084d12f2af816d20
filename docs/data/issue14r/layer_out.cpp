// Build against a release build's libraries (from the repository root):
//   g++ -O3 -march=native -fopenmp -std=c++20 -Isrc docs/data/issue14r/layer_out.cpp -o /tmp/layer_out \
//     build/release/libslope_kernels.a build/release/libslope_core.a -ldnnl -lgomp
// Run: OMP_NUM_THREADS=2 /tmp/layer_out [N (16384)] [WINDOW (128)]
// Window-128 bf16 layer calls at n: output into the chunk's rows of an n-row buffer (A) or into
// one chunk-sized buffer (B), alternated rounds.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "slope/kernels/attention.h"
using namespace slope::kernels;
int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atol(argv[1]) : 16384, window = argc > 2 ? atol(argv[2]) : 128;
  const int64_t hq = 16, hkv = 4, D = 64, chunk = 1024;
  set_bf16_units(Bf16Units::Bf16);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q_all(n * hq * D), q(chunk * hq * D), k(n * hkv * D), v(k.size()), out(q_all.size()), outc(q.size()), lse(chunk * hq);
  for (float& x : q_all) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  auto pass = [&](bool chunk_out) {
    double s = 0;
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t m = std::min(chunk, n - r);
      std::memcpy(q.data(), q_all.data() + r * hq * D, size_t(m * hq * D) * 4);
      const auto t0 = std::chrono::steady_clock::now();
      flash_attention({.q = q.data(), .nq = m, .q_pos0 = r, .k = k.data(), .v = v.data(), .nk = r + m, .kv_pos0 = 0,
                       .shape = {hq, hkv, D}, .mask = {true, window}, .scale = 0.125f, .compute = ComputeType::BF16,
                       .sinks = nullptr, .out = chunk_out ? outc.data() : out.data() + r * hq * D, .lse = lse.data()});
      s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return s;
  };
  const double f = attention_flops(n, 0, n, 0, {hq, hkv, D}, {true, window});
  for (int round = 0; round < 4; ++round)
    for (bool c : {false, true}) {
      double best = 1e30;
      for (int i = 0; i < 8; ++i) best = std::min(best, pass(c));
      std::printf("round %d %s: %.1f GFLOP/s\n", round, c ? "chunk-sized out" : "n-row out     ", f / best * 1e-9);
    }
}
