// Build against a release build's libraries (from the repository root):
//   g++ -O3 -march=native -fopenmp -std=c++20 -Isrc docs/data/issue14r/layer_walk.cpp -o /tmp/layer_walk \
//     build/release/libslope_kernels.a build/release/libslope_core.a -ldnnl -lgomp
// Run: OMP_NUM_THREADS=2 /tmp/layer_walk
// Window-128 bf16 calls of 1024 rows at n = 16384, four patterns (see mode below), alternated.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "slope/kernels/attention.h"
using namespace slope::kernels;
int main(int argc, char** argv) {
  const int64_t n = 16384, window = 128, hq = 16, hkv = 4, D = 64, chunk = 1024;
  set_bf16_units(Bf16Units::Bf16);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q_all(n * hq * D), q(chunk * hq * D), k(n * hkv * D), v(k.size()), out(q_all.size()), lse(chunk * hq);
  for (float& x : q_all) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  // mode 0: same last chunk repeated; 1: same chunk, Q memcpy'd before each; 2: walk the chunks, Q memcpy'd;
  // 3: walk the chunks, Q read in place (no copy)
  auto pass = [&](int mode) {
    double s = 0;
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t rr = mode <= 1 ? n - chunk : r;
      const float* qp = q.data();
      if (mode == 1 || mode == 2) std::memcpy(q.data(), q_all.data() + rr * hq * D, size_t(chunk * hq * D) * 4);
      if (mode == 3) qp = q_all.data() + rr * hq * D;
      const auto t0 = std::chrono::steady_clock::now();
      flash_attention({.q = qp, .nq = chunk, .q_pos0 = rr, .k = k.data(), .v = v.data(), .nk = rr + chunk, .kv_pos0 = 0,
                       .shape = {hq, hkv, D}, .mask = {true, window}, .scale = 0.125f, .compute = ComputeType::BF16,
                       .sinks = nullptr, .out = out.data() + rr * hq * D, .lse = lse.data()});
      s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return s;
  };
  const double f = attention_flops(n, 0, n, 0, {hq, hkv, D}, {true, window});
  const char* names[] = {"same chunk repeated      ", "same chunk, Q copied     ", "walk chunks, Q copied    ", "walk chunks, Q in place  "};
  for (int round = 0; round < 3; ++round)
    for (int m = 0; m < 4; ++m) {
      double best = 1e30;
      for (int i = 0; i < 8; ++i) best = std::min(best, pass(m));
      std::printf("round %d %s: %.1f GFLOP/s\n", round, names[m], f / best * 1e-9);
    }
}
