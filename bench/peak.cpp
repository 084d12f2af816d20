// The machine's arithmetic peak, measured in the same run as the kernels it is compared with.
// AVX-512: 24 independent zmm accumulators per thread (enough to cover FMA latency on Zen 4 and
// Zen 5), fp32 FMA (vfmadd231ps, 32 FLOP) and, where the CPU has AVX512-BF16, bf16 dot product
// (vdpbf16ps, 64 FLOP per instruction). Zen 5 runs both at full 512-bit width (64 / 128
// FLOP/cycle/core); Zen 4 at half that. AVX2 + FMA only (Zen 2 and 3): 12 ymm accumulators
// (two FMA pipes of latency 4 to 5), 16 FLOP per instruction, and no bf16 probe: such a CPU has
// no bf16 arithmetic, its bf16 Linears run on the FMA units (kernels/bf16_units.h), and
// scripts/peak_probe.sh reports the fp32 figure for bf16. Where the CPU has AMX (Sapphire
// Rapids and later) and the kernel grants it, a third probe runs tdpbf16ps on four independent
// accumulator tiles (16384 FLOP per instruction): oneDNN's bf16 matmul and SLOPE's AMX attention
// run there, so that is the bf16 peak on such a machine.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include "slope/kernels/cpu/amx.h"
#include "slope/kernels/cpu/unit_chain.h"

namespace {

constexpr int64_t kIters = 20'000'000;

#if defined(__AVX512F__)
constexpr int kAcc = slope::kernels::cpu::kChainAccumulators;
constexpr double kFmaFlop = 32.0;

template <bool kBf16>
double run_thread() {
  return slope::kernels::cpu::unit_chain<kBf16>(kIters);
}
#else
constexpr int kAcc = 12;
constexpr double kFmaFlop = 16.0;

template <bool kBf16>
double run_thread() {
  static_assert(!kBf16, "no bf16 probe without AVX512-BF16");
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-9f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  alignas(32) float lanes[8];
  float sum = 0;
  for (int i = 0; i < kAcc; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float x : lanes) sum += x;
  }
  return sum;
}
#endif

template <bool kBf16>
void BM_Peak(benchmark::State& state) {
  const int threads = int(state.range(0));
  double sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += run_thread<kBf16>();
  }
  benchmark::DoNotOptimize(sink);
  const double flop_per_inst = kBf16 ? 2 * kFmaFlop : kFmaFlop;
  state.counters["GFLOP/s"] = benchmark::Counter(double(threads) * kIters * kAcc * flop_per_inst / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

#if SLOPE_AMX
constexpr int64_t kAmxIters = 2'000'000;

// tmm0..3 += tmm4/5 x tmm6/7: four independent accumulators, each instruction a 16 x 32 by
// 32 x 16 bf16 product.
double run_amx_thread() {
  const slope::kernels::cpu::TileConfig cfg;
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t ab[16 * 32];
  for (auto& x : ab) x = 0x3f80;  // 1.0
  alignas(64) float c[16 * 16] = {};
  _tile_loadd(0, c, 64);
  _tile_loadd(1, c, 64);
  _tile_loadd(2, c, 64);
  _tile_loadd(3, c, 64);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (int64_t it = 0; it < kAmxIters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

void BM_PeakBf16Amx(benchmark::State& state) {
  const int threads = int(state.range(0));
  if (!slope::kernels::cpu::amx_usable()) {
    state.SkipWithError("no AMX: the CPU lacks AMX-BF16 or the kernel did not grant the tile state");
    return;
  }
  double sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += run_amx_thread();
  }
  benchmark::DoNotOptimize(sink);
  state.counters["GFLOP/s"] = benchmark::Counter(double(threads) * kAmxIters * 4 * 16384.0 / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}
#endif

}  // namespace

BENCHMARK(BM_Peak<false>)->Name("BM_PeakFp32Fma")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
#if defined(__AVX512BF16__)
BENCHMARK(BM_Peak<true>)->Name("BM_PeakBf16Dot")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
#if SLOPE_AMX
BENCHMARK(BM_PeakBf16Amx)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
BENCHMARK_MAIN();
