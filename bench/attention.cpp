// flash_attention throughput on prefill shapes, in GFLOP/s counted by attention_flops (only the
// visible (query, key) pairs, 4·D flops each) and as a fraction of the fp32 FMA peak of the
// development machine (224 GFLOP/s per core, /work/shared/reference/machine-limits.md).
//
//   build/attn/bench/bench_attention --benchmark_min_time=1x    (one iteration per case)
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cmath>
#include <ctime>
#include <cstdint>
#include <random>
#include <vector>

#include "slope/core/sys.h"
#include "slope/kernels/attention.h"

namespace {

using slope::kernels::AttentionMask;
using slope::kernels::AttentionShape;

constexpr double kPeakPerCore = 224e9;  // fp32 FMA, 512-bit, 3.5 GHz

// CPU seconds used by all threads of this process.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// args: tokens, q heads, kv heads, head_dim, window (0 = full causal)
void BM_SelfAttention(benchmark::State& state) {
  const int64_t n = state.range(0);
  const AttentionShape shape{state.range(1), state.range(2), state.range(3)};
  const AttentionMask mask{true, state.range(4)};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // q, out: [n, Hq, D]; k, v: [n, Hkv, D]; lse: [n, Hq]
  std::vector<float> q(n * shape.num_q_heads * shape.head_dim), k(n * shape.num_kv_heads * shape.head_dim),
      v(k.size()), out(q.size()), lse(n * shape.num_q_heads);
  for (float& x : q) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));

  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    slope::kernels::flash_attention({.q = q.data(), .nq = n, .q_pos0 = 0, .k = k.data(),
                                     .v = v.data(), .nk = n, .kv_pos0 = 0, .shape = shape,
                                     .mask = mask, .scale = scale, .sinks = nullptr,
                                     .out = out.data(), .lse = lse.data()});
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double cpu_s = process_cpu_seconds() - cpu0;
  const double flops = slope::kernels::attention_flops(n, 0, n, 0, shape, mask);
  const int threads = slope::num_threads();
  const double peak = kPeakPerCore * threads;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["peak_frac"] = benchmark::Counter(
      flops / peak * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // Wall-clock rates drop when other processes share the 2 cores. GFLOP/s per CPU-second of this
  // process, times the thread count, is what the kernel would do with the cores to itself
  // (OpenMP threads spin while waiting, so load imbalance still counts against it).
  state.counters["GFLOP/cpu_s*T"] =
      flops * 1e-9 * static_cast<double>(state.iterations()) / cpu_s * threads;
  state.counters["threads"] = threads;
}

BENCHMARK(BM_SelfAttention)
    ->ArgNames({"tokens", "Hq", "Hkv", "D", "window"})
    ->Args({1024, 16, 4, 64, 0})
    ->Args({4096, 16, 4, 64, 0})
    ->Args({16384, 4, 1, 64, 0})    // ~275 GFLOP per iteration
    ->Args({16384, 16, 4, 64, 128})  // gpt-oss sliding layer
    ->Args({4096, 8, 2, 128, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

#if defined(__AVX512F__)
// The FMA rate this machine gives right now: 24 independent zmm accumulators per thread, no
// memory traffic. The development machines are shared, so read attention's GFLOP/s against
// this figure from the same run rather than against the nominal peak alone.
void BM_FmaPeak(benchmark::State& state) {
  constexpr int64_t kIters = 20'000'000;
  const int threads = slope::num_threads();
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
#pragma omp parallel
    {
      __m512 acc[24];
      for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
      const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
      for (int64_t it = 0; it < kIters; ++it)
#pragma GCC unroll 24
        for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
      alignas(64) float lanes[16];
      __m512 sum = acc[0];
      for (int i = 1; i < 24; ++i) sum = _mm512_add_ps(sum, acc[i]);
      _mm512_store_ps(lanes, sum);
      benchmark::DoNotOptimize(lanes[0]);
    }
  }
  const double cpu_s = process_cpu_seconds() - cpu0;
  const double flops = 2.0 * 16 * 24 * static_cast<double>(kIters) * threads;
  state.counters["GFLOP/cpu_s*T"] =
      flops * 1e-9 * static_cast<double>(state.iterations()) / cpu_s * threads;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_frac"] =
      benchmark::Counter(flops / (kPeakPerCore * threads) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
