// Issue 14, nineteenth window: Linear on oneDNN against the panel GEMM at the MoE expert and dense
// shapes, alternated 12 times, the best of each.
// g++ -O3 -march=native -fopenmp -std=c++20 -Isrc docs/data/issue14s/gemm_probe.cpp -o /tmp/gemm_probe \
//   build/release/libslope_kernels.a build/release/libslope_core.a -ldnnl -lgomp
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "slope/core/dtype.h"
#include "slope/core/half.h"
#include "slope/kernels/gemm.h"

using namespace slope;
using namespace slope::kernels;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class F>
double best(F f, int reps) {
  double b = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = now();
    f();
    b = std::min(b, now() - t);
  }
  return b;
}

int main(int argc, char** argv) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 1);
  struct Shape { int64_t M, N, K; int threads; };
  const Shape shapes[] = {{128, 2048, 1024, 1}, {128, 1024, 1024, 1}, {512, 2048, 1024, 1}, {1024, 1536, 1024, 2},
                          {1024, 11264, 2048, 2}, {1024, 2048, 5632, 2}};
  for (const Shape& s : shapes) {
    const int64_t M = s.M, N = s.N, K = s.K;
    std::vector<float> w(static_cast<size_t>(N * K)); std::vector<float> b(static_cast<size_t>(N));
    for (auto& v : w) v = round_bf16(d(rng) * 0.03f);
    for (auto& v : b) v = d(rng);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
    set_bf16_units(Bf16Units::F32);
    set_linear_kernel(LinearKernel::OneDnn);
    Linear lin(wb.data(), DType::BF16, WeightLayout::OutIn, N, K, b.data(), ComputeType::BF16);
    set_linear_kernel(LinearKernel::Panels);
    Linear pan(wb.data(), DType::BF16, WeightLayout::OutIn, N, K, b.data(), ComputeType::BF16);
    std::vector<float> x(size_t(M * K)), y0(size_t(M * N)), y1(size_t(M * N));
    for (auto& v : x) v = round_bf16(d(rng));
    const double fl = 2.0 * M * N * K;
    omp_set_num_threads(s.threads);
    double t0 = 1e30, t1 = 1e30;
    for (int rep = 0; rep < 12; ++rep) {
      t0 = std::min(t0, best([&] { lin.forward(x.data(), M, y0.data()); }, 1));
      t1 = std::min(t1, best([&] { pan.forward(x.data(), M, y1.data()); }, 1));
      
    }
    double e1 = 0;
    for (size_t i = 0; i < y0.size(); ++i) e1 = std::max(e1, double(std::fabs(y1[i] - y0[i])));
    std::printf("M %5ld N %5ld K %5ld thr %d GFLOP/s: onednn %.1f  panels %.1f (maxdiff %.2g)\n",
                M, N, K, s.threads, fl / t0 * 1e-9, fl / t1 * 1e-9, e1);
  }
}
