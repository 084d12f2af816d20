// Window-128 attention against causal attention, per visible key (issue 14's "window at 80% of
// the causal rate"). Each figure is one flash_attention call repeated for at least
// 0.5 s × BEST_OF, the fastest call kept (bench_attention's window cases last 10-80 ms per call,
// too short for a mean to be steady on a shared machine). GFLOP/s by attention_flops (visible
// keys only), head_dim 64, f32 and bf16, 16 query heads over 4 KV heads (gpt-oss bench):
//   whole calls: all n queries against n keys, causal at 16K, window 128 at 4K, 16K and 32K;
//   chunk calls: the last 1024 queries against n keys, as the engine calls the kernel per chunk
//   of a prefill (model/layers.cpp), causal and window 128 at 4K, 16K and 32K.
// The checksum on stderr compares builds whose results must be equal.
// Usage: OMP_NUM_THREADS=2 build/release/bench/bench_attention_window [BEST_OF (default 3)]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "slope/kernels/attention.h"

using namespace slope::kernels;

namespace {

double checksum = 0;

// GFLOP/s of the fastest call: the last nq of n queries against n keys.
double rate(int64_t n, int64_t nq, int64_t window, ComputeType ct, int best_of) {
  const int64_t hq = 16, hkv = 4, D = 64;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(nq * hq * D), k(n * hkv * D), v(k.size()), out(q.size()), lse(nq * hq);
  for (float& x : q) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  const AttentionArgs a{.q = q.data(), .nq = nq, .q_pos0 = n - nq, .k = k.data(), .v = v.data(), .nk = n,
                        .kv_pos0 = 0, .shape = {hq, hkv, D}, .mask = {true, window}, .scale = 0.125f,
                        .compute = ct, .sinks = nullptr, .out = out.data(), .lse = lse.data()};
  flash_attention(a);  // warm-up
  double best_s = 1e30, total = 0;
  while (total < 0.5 * best_of) {
    const auto t0 = std::chrono::steady_clock::now();
    flash_attention(a);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_s = std::min(best_s, s);
    total += s;
  }
  for (size_t i = 0; i < out.size(); i += 997) checksum += out[i];
  return attention_flops(nq, n - nq, n, 0, a.shape, a.mask) / best_s * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int best_of = argc > 1 ? std::atoi(argv[1]) : 3;
  if (argc > 2 || best_of < 1) {
    std::fprintf(stderr, "usage: bench_attention_window [BEST_OF: a whole number >= 1, default 3]\n");
    return 2;
  }
  // bf16: the bf16 kernel wherever the CPU has it, whichever units bf16 mode chose here.
  slope::kernels::set_bf16_units(slope::kernels::Bf16Units::Bf16);
  for (ComputeType ct : {ComputeType::F32, ComputeType::BF16}) {
    const char* name = ct == ComputeType::F32 ? "f32 " : "bf16";
    const double causal = rate(16384, 16384, 0, ct, best_of);
    std::printf("%s whole calls: causal 16K %.1f GFLOP/s\n", name, causal);
    for (int64_t n : {4096, 16384, 32768}) {
      const double w = rate(n, n, 128, ct, best_of);
      std::printf("%s whole calls: window 128, n %-6ld %.1f GFLOP/s = %.2f of causal 16K\n", name, long(n), w,
                  w / causal);
    }
    for (int64_t n : {4096, 16384, 32768}) {
      const double c = rate(n, 1024, 0, ct, best_of), w = rate(n, 1024, 128, ct, best_of);
      std::printf("%s chunk calls (1024 rows), n %-6ld causal %.1f, window 128 %.1f GFLOP/s = %.2f\n", name,
                  long(n), c, w, w / c);
    }
    std::fflush(stdout);
  }
  std::fprintf(stderr, "checksum %g\n", checksum);
}
