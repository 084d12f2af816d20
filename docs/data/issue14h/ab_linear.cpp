// Same-process A/B of one Linear shape on the two bf16 units and in f32: the best of REPS calls
// of each, rounds alternated. Built against the release libraries:
//   g++ -O3 -march=native -fopenmp -std=c++20 -Isrc docs/data/issue14h/ab_linear.cpp \
//     build/release/libslope_kernels.a build/release/libslope_core.a -ldnnl -o /tmp/ab_linear
//   OMP_NUM_THREADS=2 /tmp/ab_linear M K N ROUNDS REPS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "slope/kernels/gemm.h"

using namespace slope::kernels;

template <typename F>
double best_s(F f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: ab_linear M K N ROUNDS REPS\n");
    return 2;
  }
  const int64_t M = std::atol(argv[1]), K = std::atol(argv[2]), N = std::atol(argv[3]);
  const int rounds = std::atoi(argv[4]), reps = std::atoi(argv[5]);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(N * K), x(M * K), y(M * N);
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  std::vector<uint16_t> xb(M * K);
  to_bf16(x.data(), xb.data(), M * K);
  const Linear f32(w.data(), slope::DType::F32, WeightLayout::OutIn, N, K, nullptr, ComputeType::F32);
  set_bf16_units(Bf16Units::F32);
  const Linear units(w.data(), slope::DType::F32, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16);
  set_bf16_units(Bf16Units::Bf16);
  const Linear native(w.data(), slope::DType::F32, WeightLayout::OutIn, N, K, nullptr, ComputeType::BF16);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  for (int r = 0; r < rounds; ++r) {
    const double a = best_s([&] { f32.forward(x.data(), M, y.data()); }, reps);
    const double b = best_s([&] { units.forward(x.data(), M, y.data()); }, reps);
    const double c = best_s([&] { units.forward_bf16(xb.data(), M, y.data()); }, reps);
    const double d = best_s([&] { native.forward(x.data(), M, y.data()); }, reps);
    const double e = best_s([&] { native.forward_bf16(xb.data(), M, y.data()); }, reps);
    const double t = best_s([&] { to_bf16(x.data(), xb.data(), M * K); }, reps);
    std::printf("round %d  M %ld K %ld N %ld GFLOP/s: f32 %.1f | f32 units forward %.1f, forward_bf16 %.1f | "
                "bf16 units forward %.1f, forward_bf16 %.1f | to_bf16 pass %.3f ms\n",
                r, long(M), long(K), long(N), flop / a / 1e9, flop / b / 1e9, flop / c / 1e9, flop / d / 1e9,
                flop / e / 1e9, t * 1e3);
  }
  return 0;
}
