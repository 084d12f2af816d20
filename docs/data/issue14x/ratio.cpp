// Window-128 whole calls against the causal 16K whole call, alternated in one process (bf16 on
// the bf16 units, 16 query heads over 4, head_dim 64): per pair, one causal call, then window
// calls for as long, the median of those; buffers are slope::Tensors (as the engine's: the twenty-fourth
// window's form of issue14w/ratio.cpp); prints per window length the median of the pairs'
// rate ratios (window GFLOP/s / causal GFLOP/s), its quartiles and each side's median GFLOP/s.
//   ratio PAIRS [TOKENS ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <omp.h>
#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
using namespace slope::kernels;
// A float buffer allocated as the engine allocates its tensors (slope::Tensor: from 2 MiB up on a
// 2 MiB boundary, in transparent huge pages where the system allows).
struct Floats {
  slope::Tensor t;
  float* p = nullptr;
  void resize(size_t count) {
    t = slope::Tensor({int64_t(count)}, slope::DType::F32);
    p = t.data<float>();
  }
  size_t size() const { return size_t(t.numel()); }
  float* data() { return p; }
  float* begin() { return p; }
  float* end() { return p + size(); }
};
struct Call {
  int64_t n, w;
  Floats q, k, v, out, lse;
  double flops;
  Call(int64_t n_, int64_t w_) : n(n_), w(w_) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    q.resize(n * 16 * 64), k.resize(n * 4 * 64), v.resize(k.size()), out.resize(q.size()), lse.resize(n * 16);
    for (auto* x : {&q, &k, &v}) for (float& y : *x) y = u(rng);
    flops = attention_flops(n, 0, n, 0, {16, 4, 64}, {true, w});
  }
  double run() {
    const auto t0 = std::chrono::steady_clock::now();
    flash_attention({.q = q.data(), .nq = n, .q_pos0 = 0, .k = k.data(), .v = v.data(), .nk = n, .kv_pos0 = 0,
                     .shape = {16, 4, 64}, .mask = {true, w}, .scale = 0.125f, .compute = ComputeType::BF16,
                     .sinks = nullptr, .out = out.data(), .lse = lse.data()});
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  const int pairs = argc > 1 ? std::atoi(argv[1]) : 8;
  std::vector<int64_t> ns = {4096, 16384, 32768};
  if (argc > 2) ns.clear();
  for (int i = 2; i < argc; ++i) ns.push_back(std::atol(argv[i]));
  Call causal(16384, 0);
  causal.run();
  auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
  for (int64_t n : ns) {
    Call win(n, 128);
    win.run();
    std::vector<double> ratio, rc, rw;
    for (int p = 0; p < pairs; ++p) {
      const double tc = causal.run();
      std::vector<double> tw;
      for (double spent = 0; spent < tc || tw.size() < 3;) { tw.push_back(win.run()); spent += tw.back(); }
      const double gc = causal.flops / tc * 1e-9, gw = win.flops / med(tw) * 1e-9;
      rc.push_back(gc), rw.push_back(gw), ratio.push_back(gw / gc);
    }
    std::printf("window 128, n %6ld, threads %d, pairs %d: window/causal-16K median %.3f (quartiles %.3f %.3f), GFLOP/s window %.1f causal %.1f\n",
                long(n), omp_get_max_threads(), pairs, med(ratio), med(ratio, 0.25), med(ratio, 0.75), med(rw), med(rc));
    std::fflush(stdout);
  }
}
