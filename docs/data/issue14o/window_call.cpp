// Repeats one flash_attention call (bf16 unless SLOPE_F32; 16 / 4 heads, head_dim 64: the last NQ of N queries
// against N keys, causal, window WINDOW or none) for SECONDS, for perf and quick A/B; prints
// the fastest call's and the mean GFLOP/s. Build against a release build's libraries:
//   g++ -O3 -march=native -fopenmp -std=c++20 -g -Isrc window_call.cpp -o window_call \
//     build/release/libslope_kernels.a build/release/libslope_core.a -ldnnl -lgomp
// Usage: OMP_NUM_THREADS=2 ./window_call N NQ WINDOW SECONDS   (SLOPE_NO_AMX=1: the vdpbf16ps kernel;
//        SLOPE_F32=1: the f32 kernel)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "slope/kernels/attention.h"
using namespace slope::kernels;
int main(int argc, char** argv) {
  const int64_t n = atol(argv[1]), nq = atol(argv[2]), window = atol(argv[3]);
  const double secs = atof(argv[4]);
  const int64_t hq = 16, hkv = 4, D = 64;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(nq * hq * D), k(n * hkv * D), v(k.size()), out(q.size()), lse(nq * hq);
  for (float& x : q) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  set_bf16_units(Bf16Units::Bf16);
  if (std::getenv("SLOPE_NO_AMX")) set_amx_attention(false);
  const AttentionArgs a{.q = q.data(), .nq = nq, .q_pos0 = n - nq, .k = k.data(), .v = v.data(), .nk = n,
                        .kv_pos0 = 0, .shape = {hq, hkv, D}, .mask = {true, window}, .scale = 0.125f,
                        .compute = std::getenv("SLOPE_F32") ? ComputeType::F32 : ComputeType::BF16, .sinks = nullptr, .out = out.data(), .lse = lse.data()};
  flash_attention(a);
  double best = 1e30, total = 0; int calls = 0;
  while (total < secs) {
    auto t0 = std::chrono::steady_clock::now();
    flash_attention(a);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s); total += s; ++calls;
  }
  double fl = attention_flops(nq, n - nq, n, 0, a.shape, a.mask);
  printf("n %ld nq %ld w %ld: best %.3f ms, %.1f GFLOP/s best, %.1f mean (%d calls)\n", (long)n, (long)nq,
         (long)window, best * 1e3, fl / best * 1e-9, fl * calls / total * 1e-9, calls);
}
