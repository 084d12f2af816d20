// Window-128 attention against causal attention, per visible key (issue 14's "window at 80% of
// the causal rate"). Each figure is one flash_attention call repeated for at least
// 0.5 s × BEST_OF, the fastest call kept (bench_attention's window cases last 10-80 ms per call,
// too short for a mean to be steady on a shared machine). GFLOP/s by attention_flops (visible
// keys only), head_dim 64, f32 and bf16, 16 query heads over 4 KV heads (gpt-oss bench):
//   whole calls: all n queries against n keys in one call, causal at 16K, window 128 at 4K, 16K
//   and 32K (a runner that does not hold every key, e.g. context parallelism, calls it so);
//   chunk calls: the last 1024 queries against n keys, the same call repeated (Q and the output
//   stay in the cache), causal and window 128 at 4K, 16K and 32K;
//   layer calls: all n queries as a layer would call the kernel if it attended each chunk of
//   1024 rows right after the chunk's QKV projection (model/layers.cpp makes whole calls; see
//   docs/performance.md, eighteenth window of issue 14): the chunk's Q written into one
//   chunk-sized buffer (as the projection writes it; not timed), then one call against the keys
//   before it, output into the chunk's rows; the time of a pass is the sum of its calls'. Causal
//   at 16K, window 128 at 4K, 16K and 32K.
// The checksum on stderr compares builds whose results must be equal.
// Usage: OMP_NUM_THREADS=2 build/release/bench/bench_attention_window [BEST_OF (default 3)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "slope/core/tensor.h"
#include "slope/kernels/attention.h"

using namespace slope::kernels;

namespace {

double checksum = 0;
constexpr int64_t kHq = 16, kHkv = 4, kD = 64;

// count floats, allocated as the engine allocates its tensors (slope::Tensor: on a 64-byte
// boundary, where the bf16 window units can stream large outputs past the cache).
struct Floats {
  slope::Tensor t;
  float* p;
  explicit Floats(int64_t count) : t({count}, slope::DType::F32), p(t.data<float>()) {}
  float* data() const { return p; }
  int64_t size() const { return t.numel(); }
  float& operator[](int64_t i) const { return p[i]; }
};

// count values uniform in [-1, 1).
Floats uniform(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Floats x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = u(rng);
  return x;
}

// The fastest of the runs of `timed` (each returns the seconds it timed), after one warm-up run,
// repeated until they add up to 0.5 s × best_of.
template <typename F>
double fastest_seconds(F timed, int best_of) {
  timed();
  double best_s = 1e30, total = 0;
  while (total < 0.5 * best_of) {
    const double s = timed();
    best_s = std::min(best_s, s);
    total += s;
  }
  return best_s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GFLOP/s of the fastest call: the last nq of n queries against n keys.
double rate(int64_t n, int64_t nq, int64_t window, ComputeType ct, int best_of) {
  std::mt19937 rng(1);
  const Floats q = uniform(rng, nq * kHq * kD), k = uniform(rng, n * kHkv * kD), v = uniform(rng, n * kHkv * kD);
  const Floats out(q.size()), lse(nq * kHq);
  const AttentionArgs a{.q = q.data(), .nq = nq, .q_pos0 = n - nq, .k = k.data(), .v = v.data(), .nk = n,
                        .kv_pos0 = 0, .shape = {kHq, kHkv, kD}, .mask = {true, window}, .scale = 0.125f,
                        .compute = ct, .sinks = nullptr, .out = out.data(), .lse = lse.data()};
  const double best_s = fastest_seconds(
      [&] {
        const auto t0 = std::chrono::steady_clock::now();
        flash_attention(a);
        return seconds_since(t0);
      },
      best_of);
  for (int64_t i = 0; i < out.size(); i += 997) checksum += out[i];
  return attention_flops(nq, n - nq, n, 0, a.shape, a.mask) / best_s * 1e-9;
}

// GFLOP/s of the fastest pass of layer calls (see the top): all n queries against n keys, in
// calls of 1024 rows, each right after its Q is written.
double layer_rate(int64_t n, int64_t window, ComputeType ct, int best_of) {
  const int64_t chunk = 1024;
  std::mt19937 rng(1);
  const Floats q_all = uniform(rng, n * kHq * kD), k = uniform(rng, n * kHkv * kD), v = uniform(rng, n * kHkv * kD);
  const Floats q(chunk * kHq * kD), out(q_all.size()), lse(chunk * kHq);
  const double best_s = fastest_seconds(
      [&] {
        double s = 0;
        for (int64_t r = 0; r < n; r += chunk) {
          const int64_t m = std::min(chunk, n - r);
          std::memcpy(q.data(), q_all.data() + r * kHq * kD, size_t(m * kHq * kD) * sizeof(float));
          const auto t0 = std::chrono::steady_clock::now();
          flash_attention({.q = q.data(), .nq = m, .q_pos0 = r, .k = k.data(), .v = v.data(), .nk = r + m,
                           .kv_pos0 = 0, .shape = {kHq, kHkv, kD}, .mask = {true, window}, .scale = 0.125f,
                           .compute = ct, .sinks = nullptr, .out = out.data() + r * kHq * kD,
                           .lse = lse.data()});
          s += seconds_since(t0);
        }
        return s;
      },
      best_of);
  for (int64_t i = 0; i < out.size(); i += 997) checksum += out[i];
  return attention_flops(n, 0, n, 0, {kHq, kHkv, kD}, {true, window}) / best_s * 1e-9;
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
    const double layer_causal = layer_rate(16384, 0, ct, best_of);
    std::printf("%s layer calls (1024 rows): causal 16K %.1f GFLOP/s = %.2f of whole calls\n", name, layer_causal,
                layer_causal / causal);
    for (int64_t n : {4096, 16384, 32768}) {
      const double w = layer_rate(n, 128, ct, best_of);
      std::printf("%s layer calls (1024 rows): window 128, n %-6ld %.1f GFLOP/s = %.2f of layer causal 16K, %.2f of whole\n",
                  name, long(n), w, w / layer_causal, w / causal);
    }
    std::fflush(stdout);
  }
  std::fprintf(stderr, "checksum %g\n", checksum);
}
