// The prefill's own full-attention calls at N tokens (gpt-oss bench heads: 16 q / 4 KV, D 64,
// causal, chunks of 1024 query rows against all keys so far), f32 kernel, with and without the
// per-KV-head K/V copy (SLOPE_PACK_KV, f32-kv-pack.patch read per call), rounds alternated.
//   OMP_NUM_THREADS=2 ab_pack_chunks N ROUNDS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "slope/kernels/attention.h"

using namespace slope::kernels;

int main(int argc, char** argv) {
  const int64_t N = std::atol(argv[1]), chunk = 1024, Hq = 16, Hkv = 4, D = 64;
  const int rounds = std::atoi(argv[2]);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(N * Hq * D), k(N * Hkv * D), v(N * Hkv * D), out(chunk * Hq * D), lse(chunk * Hq);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = u(rng);
  double flops = 0;
  for (int64_t c0 = 0; c0 < N; c0 += chunk)
    flops += attention_flops(std::min(chunk, N - c0), c0, c0 + std::min(chunk, N - c0), 0, {Hq, Hkv, D}, {true, 0});
  double sum = 0;
  for (int r = 0; r < rounds; ++r)
    for (int pack = 0; pack < 2; ++pack) {
      if (pack) setenv("SLOPE_PACK_KV", "1", 1);
      else unsetenv("SLOPE_PACK_KV");
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t nq = std::min(chunk, N - c0);
        flash_attention({.q = q.data() + c0 * Hq * D, .nq = nq, .q_pos0 = c0, .k = k.data(), .v = v.data(),
                         .nk = c0 + nq, .kv_pos0 = 0, .shape = {Hq, Hkv, D}, .mask = {true, 0},
                         .scale = 0.125f, .compute = ComputeType::F32, .out = out.data(), .lse = lse.data()});
        sum += out[7];
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d N %ld copy %d: %.3f s, %.1f GFLOP/s\n", r, long(N), pack, s, flops / s / 1e9);
      std::fflush(stdout);
    }
  std::fprintf(stderr, "checksum %g\n", sum);
}
