// The machine's arithmetic peak, measured in the same run as the kernels it is compared with:
// 24 independent zmm accumulators per thread (enough to cover FMA latency on Zen 4 and Zen 5),
// fp32 FMA (vfmadd231ps, 32 FLOP) and bf16 dot product (vdpbf16ps, 64 FLOP per instruction).
// Zen 5 runs both at full 512-bit width (64 / 128 FLOP/cycle/core); Zen 4 at half that.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int kAcc = 24;
constexpr int64_t kIters = 20'000'000;

template <bool kBf16>
double run_thread() {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-9f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  const __m512bh ab = _mm512_cvtne2ps_pbh(a, a), bb = _mm512_cvtne2ps_pbh(b, b);
  for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kAcc; ++i) {
      if constexpr (kBf16)
        acc[i] = _mm512_dpbf16_ps(acc[i], ab, bb);
      else
        acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
  }
  float sum = 0;
  for (int i = 0; i < kAcc; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}

template <bool kBf16>
void BM_Peak(benchmark::State& state) {
  const int threads = int(state.range(0));
  double sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += run_thread<kBf16>();
  }
  benchmark::DoNotOptimize(sink);
  const double flop_per_inst = kBf16 ? 64.0 : 32.0;
  state.counters["GFLOP/s"] = benchmark::Counter(double(threads) * kIters * kAcc * flop_per_inst / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

}  // namespace

BENCHMARK(BM_Peak<false>)->Name("BM_PeakFp32Fma")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Peak<true>)->Name("BM_PeakBf16Dot")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
