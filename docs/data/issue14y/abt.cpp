// In-process A/B through an environment switch read once a call (AB_VAR set to AB_A, then AB_B),
// with slope::Tensor buffers (the engine's 64-byte alignment). Calls alternate A B, then B A, on
// the same inputs; per shape: the median of the pairs' time ratios A/B (above 1: B faster), its
// quartiles, each side's median GFLOP/s, and the causal 16K call's rate when AB_CAUSAL=1 (then
// alternated too: window A, window B, causal). It first checks that A and B give identical outputs.
//   OMP_NUM_THREADS=2 AB_VAR=X AB_A=0 AB_B=1 abt SECONDS [TOKENS ...]  (16 over 4 heads, D 64, window 128)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <omp.h>
#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
using namespace slope::kernels;
using slope::Tensor;
using slope::DType;
struct Bufs {
  Tensor q, k, v, out, lse;
  explicit Bufs(int64_t n) : q({n * 16 * 64}, DType::F32), k({n * 4 * 64}, DType::F32), v({n * 4 * 64}, DType::F32),
                             out({n * 16 * 64}, DType::F32), lse({n * 16}, DType::F32) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (Tensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = u(rng);
  }
};
static double call(Bufs& b, int64_t n, int64_t window, const char* value) {
  if (value) setenv(getenv("AB_VAR"), value, 1);
  const auto t0 = std::chrono::steady_clock::now();
  flash_attention({.q = b.q.data<float>(), .nq = n, .q_pos0 = 0, .k = b.k.data<float>(), .v = b.v.data<float>(),
                   .nk = n, .kv_pos0 = 0, .shape = {16, 4, 64}, .mask = {true, window}, .scale = 0.125f,
                   .compute = ComputeType::BF16, .sinks = nullptr, .out = b.out.data<float>(),
                   .lse = b.lse.data<float>()});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  const double budget = argc > 1 ? std::atof(argv[1]) : 20;
  std::vector<int64_t> ns = {4096, 16384, 32768};
  if (argc > 2) ns.clear();
  for (int i = 2; i < argc; ++i) ns.push_back(std::atol(argv[i]));
  const bool causal = getenv("AB_CAUSAL") && *getenv("AB_CAUSAL") == '1';
  auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
  const char *A = getenv("AB_A"), *B = getenv("AB_B");
  std::unique_ptr<Bufs> cb;
  const double cflops = attention_flops(16384, 0, 16384, 0, {16, 4, 64}, {true, 0});
  if (causal) cb = std::make_unique<Bufs>(16384), call(*cb, 16384, 0, nullptr);
  for (int64_t n : ns) {
    Bufs b(n);
    call(b, n, 128, A);
    const std::vector<float> a(b.out.data<float>(), b.out.data<float>() + b.out.numel());
    call(b, n, 128, B);
    if (std::memcmp(a.data(), b.out.data<float>(), a.size() * sizeof(float)) != 0) {
      std::printf("outputs differ at %ld tokens\n", long(n));
      return 1;
    }
    const double flops = attention_flops(n, 0, n, 0, {16, 4, 64}, {true, 128});
    std::vector<double> r, ga, gb, gc, ra, rb;
    for (double spent = 0; spent < budget || r.size() < 6;) {
      const bool ab = r.size() % 2 == 0;
      const double t1 = call(b, n, 128, ab ? A : B), t2 = call(b, n, 128, ab ? B : A);
      const double ta = ab ? t1 : t2, tb = ab ? t2 : t1;
      r.push_back(ta / tb), ga.push_back(flops / ta * 1e-9), gb.push_back(flops / tb * 1e-9);
      spent += t1 + t2;
      if (causal) {
        const double tc = call(*cb, 16384, 0, nullptr);
        gc.push_back(cflops / tc * 1e-9), ra.push_back(ga.back() / gc.back()), rb.push_back(gb.back() / gc.back());
        spent += tc;
      }
    }
    std::printf("tokens %6ld threads %d pairs %4zu  A/B median %.3f (quartiles %.3f %.3f)  GFLOP/s A %.1f B %.1f",
                long(n), omp_get_max_threads(), r.size(), med(r), med(r, 0.25), med(r, 0.75), med(ga), med(gb));
    if (causal) std::printf("  causal16K %.1f  window/causal A %.3f B %.3f", med(gc), med(ra), med(rb));
    std::printf("\n");
    std::fflush(stdout);
  }
}
