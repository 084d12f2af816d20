// flash_attention throughput on prefill shapes, in GFLOP/s counted by attention_flops (only the
// visible (query, key) pairs, 4·D flops each) and as a fraction of the nominal peak of the
// development machine (fp32 FMA 224 GFLOP/s per core, /work/shared/reference/machine-limits.md;
// bf16 vdpbf16ps twice that). BM_SelfAttention runs compute = F32, BM_SelfAttentionBf16
// compute = BF16 (the f32 kernel where the CPU lacks AVX512-BF16: the label says which ran; on
// AMX tiles where the CPU has AMX), BM_SelfAttentionBf16Dot compute = BF16 without AMX.
// Read the rates against bench_peak's fp32 and bf16 figures from the same session.
//
//   build/release/bench/bench_attention --benchmark_min_time=0.5
//   build/release/bench/bench_attention --benchmark_min_time=0.01   (a quick look: one iteration)
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
// compute = BF16 is the bf16 kernel wherever the CPU has it, whichever units bf16 mode chose here
// (kernels/bf16_units.h; on the f32 units bf16 mode runs what compute = F32 measures).
void self_attention(benchmark::State& state, slope::kernels::ComputeType compute, bool causal = true) {
  slope::kernels::set_bf16_units(compute == slope::kernels::ComputeType::BF16 ? slope::kernels::Bf16Units::Bf16
                                                                              : slope::kernels::Bf16Units::Auto);
  const int64_t n = state.range(0);
  const AttentionShape shape{state.range(1), state.range(2), state.range(3)};
  const AttentionMask mask{causal, causal ? state.range(4) : 0};
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
                                     .mask = mask, .scale = scale, .compute = compute,
                                     .sinks = nullptr,
                                     .out = out.data(), .lse = lse.data()});
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double cpu_s = process_cpu_seconds() - cpu0;
  const double flops = slope::kernels::attention_flops(n, 0, n, 0, shape, mask);
  const int threads = slope::num_threads();
  const bool bf16 = compute == slope::kernels::ComputeType::BF16 &&
                    slope::kernels::bf16_attention_supported();
  const double peak = kPeakPerCore * threads * (bf16 ? 2 : 1);
  if (compute == slope::kernels::ComputeType::BF16)
    state.SetLabel(bf16 ? "bf16 kernel" : "no AVX512-BF16: f32 kernel");
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

void BM_SelfAttention(benchmark::State& state) {
  self_attention(state, slope::kernels::ComputeType::F32);
}
void BM_SelfAttentionBf16(benchmark::State& state) {
  self_attention(state, slope::kernels::ComputeType::BF16);
}
void BM_SelfAttentionBf16Dot(benchmark::State& state) {
  slope::kernels::set_amx_attention(false);
  self_attention(state, slope::kernels::ComputeType::BF16);
  slope::kernels::set_amx_attention(true);
}

// The shapes of both compute types: issue 14's 4K, 16K and 32K, causal and window 128, head_dim
// 64 (causal with 4 q heads over 1 KV head, ~275 GFLOP per iteration at 16K; window 128 with
// gpt-oss's 16 over 4), and two more shapes.
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "Hq", "Hkv", "D", "window"});
  for (int64_t n : {4096, 16384, 32768}) {
    b->Args({n, 4, 1, 64, 0});
    b->Args({n, 16, 4, 64, 128});  // gpt-oss sliding layer
  }
  b->Args({4096, 16, 4, 64, 0});
  b->Args({4096, 8, 2, 128, 0});
}
BENCHMARK(BM_SelfAttention)->Apply(shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SelfAttentionBf16)->Apply(shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SelfAttentionBf16Dot)->Apply(shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

// llama.cpp's one prefill-sized flash-attention case in `test-backend-ops perf`
// (FLASH_ATTN_EXT hsk=hsv=72, nh=16, kv=nb=5776, no mask, f16 K/V): the same shape here, f32 and
// bf16, for the side-by-side in docs/performance.md.
void BM_NoMask(benchmark::State& state) { self_attention(state, slope::kernels::ComputeType::F32, false); }
void BM_NoMaskBf16(benchmark::State& state) { self_attention(state, slope::kernels::ComputeType::BF16, false); }
void peer_shape(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "Hq", "Hkv", "D", "window"});
  b->Args({5776, 16, 16, 72, 0});
}
BENCHMARK(BM_NoMask)->Apply(peer_shape)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_NoMaskBf16)->Apply(peer_shape)->Unit(benchmark::kMillisecond)->UseRealTime();

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
