// In-process A/B of the bf16 diagonal window units' non-temporal output stores: A writes the
// output through the cache (set_attention_stream_bytes(2^62)), B streams it
// (set_attention_stream_bytes(0)); buffers are slope::Tensors as the engine's (2 MiB aligned, in
// huge pages where the system allows). Calls alternate A B, then B A, on the same inputs; per
// shape the median of the pairs' time ratios A/B (above 1: streaming faster), its quartiles and
// each side's median GFLOP/s. It first checks that A and B give identical outputs.
//   OMP_NUM_THREADS=2 ab_stream SECONDS [TOKENS ...]   (16 over 4 heads, D 64, causal window 128)
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
int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  const double budget = argc > 1 ? std::atof(argv[1]) : 20;
  std::vector<int64_t> ns = {4096, 16384, 32768};
  if (argc > 2) ns.clear();
  for (int i = 2; i < argc; ++i) ns.push_back(std::atol(argv[i]));
  auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
  for (int64_t n : ns) {
    using slope::Tensor;
    using slope::DType;
    Tensor q({n * 16 * 64}, DType::F32), k({n * 4 * 64}, DType::F32), v({n * 4 * 64}, DType::F32),
        out({n * 16 * 64}, DType::F32), lse({n * 16}, DType::F32);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (Tensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = u(rng);
    const AttentionShape shape{16, 4, 64};
    const AttentionMask mask{true, 128};
    auto call = [&](bool stream) {
      set_attention_stream_bytes(stream ? 0 : int64_t{1} << 62);
      const auto t0 = std::chrono::steady_clock::now();
      flash_attention({.q = q.data<float>(), .nq = n, .q_pos0 = 0, .k = k.data<float>(), .v = v.data<float>(),
                       .nk = n, .kv_pos0 = 0, .shape = shape, .mask = mask, .scale = 0.125f,
                       .compute = ComputeType::BF16, .sinks = nullptr, .out = out.data<float>(),
                       .lse = lse.data<float>()});
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    call(false);
    const std::vector<float> a(out.data<float>(), out.data<float>() + out.numel());
    call(true);
    if (std::memcmp(a.data(), out.data<float>(), a.size() * sizeof(float)) != 0) {
      std::printf("outputs differ at %ld tokens\n", long(n));
      return 1;
    }
    const double flops = attention_flops(n, 0, n, 0, shape, mask);
    std::vector<double> r, ga, gb;
    for (double spent = 0; spent < budget;) {
      const bool ab = r.size() % 2 == 0;
      const double t1 = call(!ab), t2 = call(ab);
      const double ta = ab ? t1 : t2, tb = ab ? t2 : t1;
      r.push_back(ta / tb), ga.push_back(flops / ta * 1e-9), gb.push_back(flops / tb * 1e-9);
      spent += t1 + t2;
    }
    std::printf("tokens %6ld window 128 threads %d pairs %4zu  cached/streamed median %.3f (quartiles %.3f %.3f)  GFLOP/s cached %.1f streamed %.1f\n",
                long(n), omp_get_max_threads(), r.size(), med(r), med(r, 0.25), med(r, 0.75), med(ga), med(gb));
    std::fflush(stdout);
  }
}
