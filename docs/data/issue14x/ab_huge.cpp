// In-process A/B of the caller's buffers (q, k, v, out, lse) on 4 KiB pages (A: 64-byte aligned,
// no advice) against transparent huge pages (B: 2 MiB aligned, madvise(MADV_HUGEPAGE)), same
// contents, calls alternated A B then B A; per shape the median of the pairs' time ratios A/B
// (above 1: huge pages faster), quartiles, each side's median GFLOP/s; checks identical outputs.
//   ab_huge SECONDS [TOKENS,WINDOW ...]   (16 over 4 heads, head_dim 64, causal, bf16)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <sys/mman.h>
#include <omp.h>
#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
using namespace slope::kernels;
static float* buffer(size_t n, bool huge) {
  const size_t page = size_t{2} << 20, bytes = (n * sizeof(float) + page - 1) / page * page;
  float* p = static_cast<float*>(std::aligned_alloc(huge ? page : 64, bytes));
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return p;
}
struct Set {
  float *q, *k, *v, *out, *lse;
  Set(int64_t n, bool huge) {
    q = buffer(n * 16 * 64, huge), k = buffer(n * 4 * 64, huge), v = buffer(n * 4 * 64, huge);
    out = buffer(n * 16 * 64, huge), lse = buffer(n * 16, huge);
  }
};
static double call(const Set& s, int64_t n, int64_t w) {
  const auto t0 = std::chrono::steady_clock::now();
  flash_attention({.q = s.q, .nq = n, .q_pos0 = 0, .k = s.k, .v = s.v, .nk = n, .kv_pos0 = 0,
                   .shape = {16, 4, 64}, .mask = {true, w}, .scale = 0.125f, .compute = ComputeType::BF16,
                   .sinks = nullptr, .out = s.out, .lse = s.lse});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  const double budget = argc > 1 ? std::atof(argv[1]) : 20;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 128}, {16384, 128}, {32768, 128}, {16384, 0}};
  if (argc > 2) shapes.clear();
  for (int i = 2; i < argc; ++i) { long n, w; std::sscanf(argv[i], "%ld,%ld", &n, &w); shapes.push_back({n, w}); }
  auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
  for (auto [n, w] : shapes) {
    Set a(n, false), b(n, true);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < n * 16 * 64; ++i) a.q[i] = b.q[i] = u(rng);
    for (int64_t i = 0; i < n * 4 * 64; ++i) a.k[i] = b.k[i] = u(rng), a.v[i] = b.v[i] = u(rng);
    call(a, n, w), call(b, n, w);
    if (std::memcmp(a.out, b.out, n * 16 * 64 * 4) || std::memcmp(a.lse, b.lse, n * 16 * 4)) {
      std::printf("outputs differ\n");
      return 1;
    }
    const double flops = attention_flops(n, 0, n, 0, {16, 4, 64}, {true, w});
    std::vector<double> r, ga, gb;
    for (double spent = 0; spent < budget;) {
      const bool ab = r.size() % 2 == 0;
      const double t1 = call(ab ? a : b, n, w), t2 = call(ab ? b : a, n, w);
      const double ta = ab ? t1 : t2, tb = ab ? t2 : t1;
      r.push_back(ta / tb), ga.push_back(flops / ta * 1e-9), gb.push_back(flops / tb * 1e-9);
      spent += t1 + t2;
    }
    std::printf("tokens %6ld window %3ld threads %d pairs %4zu  4K/huge median %.3f (quartiles %.3f %.3f)  GFLOP/s 4K %.1f huge %.1f\n",
                long(n), long(w), omp_get_max_threads(), r.size(), med(r), med(r, 0.25), med(r, 0.75), med(ga), med(gb));
    std::fflush(stdout);
  }
}
