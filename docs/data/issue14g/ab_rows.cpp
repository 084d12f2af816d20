// In-process A/B of row-kernel variants: each argument after the first four is a variant
// (slope_rows_variant bits); rounds alternate them, best of 5 calls per round.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "slope/kernels/attention.h"
extern "C" int slope_rows_variant;
using namespace slope::kernels;
int main(int argc, char** argv) {
  const int64_t n = atol(argv[1]), nq = atol(argv[2]), window = atol(argv[3]), rounds = atol(argv[4]);
  std::vector<int> vars; for (int i = 5; i < argc; ++i) vars.push_back(atoi(argv[i]));
  const int64_t hq = 16, hkv = 4, D = 64;
  std::mt19937 rng(1); std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(nq*hq*D), k(n*hkv*D), v(k.size()), out(q.size()), lse(nq*hq);
  for (float& x : q) x = u(rng); for (float& x : k) x = u(rng); for (float& x : v) x = u(rng);
  AttentionArgs a{.q = q.data(), .nq = nq, .q_pos0 = n - nq, .k = k.data(), .v = v.data(), .nk = n,
                  .kv_pos0 = 0, .shape = {hq, hkv, D}, .mask = {true, window}, .scale = 0.125f,
                  .compute = ComputeType::BF16, .sinks = nullptr, .out = out.data(), .lse = lse.data()};
  AttentionArgs c = a; c.mask = {true, 0};
  const double fl = attention_flops(nq, n - nq, n, 0, a.shape, a.mask), flc = attention_flops(nq, n - nq, n, 0, c.shape, c.mask);
  std::vector<double> best(vars.size() + 2, 1e30);
  for (int r = 0; r < rounds; ++r)
    for (size_t m = 0; m < vars.size() + 2; ++m) {
      if (m < vars.size()) { slope_rows_variant = vars[m]; unsetenv("OLDK"); } else if (m == vars.size()) { setenv("OLDK", "1", 1); } else unsetenv("OLDK");
      const AttentionArgs& x = m == vars.size() + 1 ? c : a;
      flash_attention(x);
      for (int rep = 0; rep < 5; ++rep) { auto t0 = std::chrono::steady_clock::now(); flash_attention(x);
        best[m] = std::min(best[m], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()); }
    }
  const double causal = flc / best.back() * 1e-9;
  for (size_t m = 0; m < vars.size(); ++m) printf("variant %d: %.1f GFLOP/s = %.2f of causal\n", vars[m], fl / best[m] * 1e-9, fl / best[m] * 1e-9 / causal);
  printf("block kernel: %.1f = %.2f; causal %.1f\n", fl / best[vars.size()] * 1e-9, fl / best[vars.size()] * 1e-9 / causal, causal);
}
