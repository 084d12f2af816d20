// slope::kernels::Linear (oneDNN matmul, prepacked weights) on prefill shapes, f32 and bf16.
// Counters: GFLOP/s and % of the machine's peak (docs/performance.md; 2-core Zen 5: f32 224,
// bf16 448 GFLOP/s per thread). The BLAS library comparison is bench/gemm_libraries.cpp.
//
//   build/gemm/bench/bench_gemm --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "slope/core/sys.h"
#include "slope/kernels/gemm.h"

namespace {

using slope::kernels::ComputeType;
using slope::kernels::Linear;
using slope::kernels::WeightLayout;

constexpr double kPeakPerThreadF32 = 224e9, kPeakPerThreadBf16 = 448e9;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// args: M, N, K, compute type (0 f32, 1 bf16), layout (0 OutIn, 1 InOut)
void BM_Linear(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const ComputeType ct = state.range(3) ? ComputeType::BF16 : ComputeType::F32;
  const WeightLayout layout = state.range(4) ? WeightLayout::InOut : WeightLayout::OutIn;
  const auto w = random_floats(N * K, 1);
  const auto bias = random_floats(N, 2);
  const auto x = random_floats(M * K, 3);
  std::vector<float> y(M * N);
  const Linear lin(w.data(), slope::DType::F32, layout, N, K, bias.data(), ct);
  lin.forward(x.data(), M, y.data());  // builds and caches the primitive for this M
  for (auto _ : state) {
    lin.forward(x.data(), M, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * M * N * K;
  const double peak = (ct == ComputeType::BF16 ? kPeakPerThreadBf16 : kPeakPerThreadF32) *
                      std::min(slope::num_threads(), 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["%peak"] =
      benchmark::Counter(flops / peak * 100.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = slope::num_threads();
  state.SetLabel(ct == ComputeType::BF16 ? "bf16" : "f32");
}

void prefill_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t M : {512, 2048})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {5760, 2880}, {2880, 5760},
                        {2048, 1024}, {1024, 1024}})
      for (int ct : {0, 1}) b->Args({M, N, K, ct, 0});
  // gpt-oss expert layout ([K, N] weights) on one shape, to show layout does not matter once packed.
  for (int ct : {0, 1}) b->Args({2048, 5760, 2880, ct, 1});
  // The MoE's expert GEMMs on the bench gpt-oss (H = I = 1024): its chunks of 128 rows
  // (backend_cpu.cpp, kExpertRows), the smaller last chunks, and a quarter of gate_up's columns.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{2048, 1024}, {1024, 1024}})
    for (int64_t M : {128, 64, 32, 16}) b->Args({M, N, K, 1, 0});
  b->Args({128, 512, 1024, 1, 0});
  // Small chunks (decode-like or a short last chunk).
  for (int ct : {0, 1}) b->Args({17, 2880, 2880, ct, 0});
}

// A MoE's expert GEMMs as one thread runs them (backend_cpu.cpp): E Linears of one shape, each
// taking `chunks` calls of M rows in turn before the next, so that each expert's packed weights
// come back from L3 or memory, not stay in the core's caches as BM_Linear's one weight does.
// args: M, N, K, E, chunks (bf16).
void BM_LinearExperts(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2), E = state.range(3),
                chunks = state.range(4);
  std::vector<Linear> experts;
  for (int64_t e = 0; e < E; ++e) {
    const auto w = random_floats(N * K, uint32_t(10 + e));
    experts.emplace_back(w.data(), slope::DType::F32, WeightLayout::OutIn, N, K, nullptr,
                         ComputeType::BF16);
  }
  const auto x = random_floats(M * K, 3);
  std::vector<float> y(M * N);
  for (const Linear& lin : experts) lin.forward(x.data(), M, y.data());
  for (auto _ : state)
    for (const Linear& lin : experts)
      for (int64_t c = 0; c < chunks; ++c) {
        lin.forward(x.data(), M, y.data());
        benchmark::DoNotOptimize(y.data());
      }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * E * chunks * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = slope::num_threads();
}
BENCHMARK(BM_LinearExperts)
    ->ArgNames({"M", "N", "K", "E", "chunks"})
    ->Args({128, 2048, 1024, 1, 4})
    ->Args({128, 2048, 1024, 8, 4})
    ->Args({128, 1024, 1024, 1, 4})
    ->Args({128, 1024, 1024, 8, 4})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_Linear)
    ->ArgNames({"M", "N", "K", "bf16", "InOut"})
    ->Apply(prefill_shapes)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
