// In-process A/B of the bf16 diagonal window units' unaligned loads (SLOPE_DIAG_LOADU=1) against
// valignd cuts of aligned loads (=0); the outputs must be identical: the two alternate on the same inputs in one process, A then B, then B
// then A, so that the host's slow and fast spells fall on both alike. Per shape: the median of
// the pairs' time ratios (one / two blocks: above 1, two blocks are faster), its quartiles, and
// each variant's median GFLOP/s. Built and run by run_ab_two_blocks.sh.
//   ab_two_blocks SECONDS_PER_SHAPE [TOKENS,HQ,HKV,WINDOW ...]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <omp.h>

#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"

using namespace slope::kernels;

// The output at a 64-byte boundary with AB_ALIGN_OUT=1 (as the engine's tensors are); else where
// std::vector puts it (16 bytes past one for these sizes).
static int64_t out_shift(const std::vector<float>& out) {
  if (!getenv("AB_ALIGN_OUT")) return 0;
  return (16 - int64_t(reinterpret_cast<uintptr_t>(out.data()) % 64) / 4) % 16;
}

static double call(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                   std::vector<float>& out, std::vector<float>& lse, int64_t n, AttentionShape shape,
                   AttentionMask mask, bool qb2) {
  setenv(getenv("AB_VAR"), qb2 ? getenv("AB_B") : getenv("AB_A"), 1);
  const auto t0 = std::chrono::steady_clock::now();
  flash_attention({.q = q.data(), .nq = n, .q_pos0 = 0, .k = k.data(), .v = v.data(), .nk = n, .kv_pos0 = 0,
                   .shape = shape, .mask = mask, .scale = 0.125f, .compute = ComputeType::BF16, .sinks = nullptr,
                   .out = out.data() + out_shift(out), .lse = lse.data()});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
  set_bf16_units(Bf16Units::Bf16);
  const double budget = argc > 1 ? std::atof(argv[1]) : 30;
  struct S { int64_t n, hq, hkv, w; };
  std::vector<S> shapes = {{4096, 16, 4, 128}, {16384, 16, 4, 128}, {32768, 16, 4, 128}};
  if (argc > 2) shapes.clear();
  for (int i = 2; i < argc; ++i) {  // tokens,Hq,Hkv,window
    S x{};
    std::sscanf(argv[i], "%ld,%ld,%ld,%ld", &x.n, &x.hq, &x.hkv, &x.w);
    shapes.push_back(x);
  }
  for (const S& s : shapes) {
    const AttentionShape shape{s.hq, s.hkv, 64};
    const AttentionMask mask{true, s.w};
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> q(s.n * s.hq * 64), k(s.n * s.hkv * 64), v(k.size()), out(q.size() + 16), lse(s.n * s.hq);
    for (auto* vec : {&q, &k, &v}) for (float& x : *vec) x = u(rng);
    const double flops = attention_flops(s.n, 0, s.n, 0, shape, mask);
    call(q, k, v, out, lse, s.n, shape, mask, false);
    const std::vector<float> out_a = out;
    call(q, k, v, out, lse, s.n, shape, mask, true);
    if (out != out_a && !getenv("AB_NOCHECK")) { std::printf("outputs differ\n"); return 1; }
    std::vector<double> ratio, ta, tb;
    double spent = 0;
    for (int i = 0; spent < budget || i < 6; ++i) {
      double a, b;
      if (i % 2 == 0) { a = call(q, k, v, out, lse, s.n, shape, mask, false); b = call(q, k, v, out, lse, s.n, shape, mask, true); }
      else { b = call(q, k, v, out, lse, s.n, shape, mask, true); a = call(q, k, v, out, lse, s.n, shape, mask, false); }
      ta.push_back(a), tb.push_back(b), ratio.push_back(a / b);
      spent += a + b;
    }
    auto med = [](std::vector<double> x, double f = 0.5) { std::sort(x.begin(), x.end()); return x[size_t(f * (x.size() - 1))]; };
    std::printf("tokens %6ld Hq %2ld Hkv %ld window %3ld threads %d pairs %3zu  A/B median %.3f (quartiles %.3f %.3f)  GFLOP/s A %.1f B %.1f\n",
                long(s.n), long(s.hq), long(s.hkv), long(s.w), omp_get_max_threads(), ratio.size(), med(ratio), med(ratio, 0.25), med(ratio, 0.75),
                flops * 1e-9 / med(ta), flops * 1e-9 / med(tb));
    std::fflush(stdout);
  }
}
