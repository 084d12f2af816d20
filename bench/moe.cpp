// The MoE's experts as the engine runs them (ops::Backend::moe_experts on the CPU backend: routed
// rows gathered, gate_up, SwiGLU and down per expert, combined into h) against the dense MLP of
// the same FLOPs, in one process: issue 14's "MoE at the speed of a dense GEMM of the same
// FLOPs". gpt-oss bench's shape (H = I = 1024, 8 experts, top 4), bf16, on the process's threads
// (OMP_NUM_THREADS), for a MoE call of 1024 tokens (the engine's default chunk of the token-local
// work, --chunk) and of 4096. With `shared` every expert is the same weight (one expert's 6 MiB
// instead of eight), which separates the cost of eight experts' weights from the rest.
//
//   OMP_NUM_THREADS=2 build/release/bench/bench_moe
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "slope/core/sys.h"
#include "slope/kernels/gemm.h"
#include "slope/ops/backend.h"

namespace {

using slope::DType;
using slope::kernels::ComputeType;
using slope::kernels::WeightLayout;

constexpr int64_t kHidden = 1024, kInter = 1024, kExperts = 8;
constexpr int kTopK = 4;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;  // gpt-oss's SwiGLU

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

slope::ops::Linear random_linear(int64_t out, int64_t in, uint32_t seed, bool bias) {
  const auto w = random_floats(size_t(out * in), seed, 0.03f);
  const auto b = random_floats(size_t(out), seed + 1, 0.1f);
  return slope::ops::cpu().linear(w.data(), DType::F32, WeightLayout::OutIn, out, in, bias ? b.data() : nullptr,
                                  ComputeType::BF16);
}

void set_rate(benchmark::State& state, int64_t tokens) {
  const double flops = 2.0 * tokens * kTopK * 3 * kInter * kHidden;  // gate_up (2I) and down (I) per routed row
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = slope::num_threads();
}

// args: tokens, shared (1: every expert the same weights)
void BM_MoeExperts(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const bool shared = state.range(1) != 0;
  const slope::ops::Backend& ops = slope::ops::cpu();
  std::vector<slope::ops::Linear> gate_up, down;
  for (int64_t e = 0; e < kExperts; ++e) {
    if (shared && e > 0) {
      gate_up.push_back(gate_up[0]);
      down.push_back(down[0]);
      continue;
    }
    gate_up.push_back(random_linear(2 * kInter, kHidden, uint32_t(10 + 4 * e), true));
    down.push_back(random_linear(kHidden, kInter, uint32_t(12 + 4 * e), true));
  }
  const auto logits = random_floats(size_t(tokens * kExperts), 1);
  const auto x = random_floats(size_t(tokens * kHidden), 2);
  std::vector<float> h(size_t(tokens * kHidden), 0.f);
  const slope::ops::ExpertRouting g = ops.route_experts(logits.data(), tokens, kExperts, kTopK);
  ops.moe_experts(gate_up, down, g, x.data(), kHidden, kInter, kAlpha, kLimit, h.data());  // builds the primitives
  for (auto _ : state) {
    ops.moe_experts(gate_up, down, g, x.data(), kHidden, kInter, kAlpha, kLimit, h.data());
    benchmark::DoNotOptimize(h.data());
  }
  set_rate(state, tokens);
}
BENCHMARK(BM_MoeExperts)
    ->ArgNames({"tokens", "shared"})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The dense MLP of the same FLOPs: gate_up to an intermediate of top_k · I, the SwiGLU, and down.
// args: tokens
void BM_DenseMlpSameFlops(benchmark::State& state) {
  const int64_t tokens = state.range(0), inter = kTopK * kInter;
  const slope::ops::Backend& ops = slope::ops::cpu();
  const slope::ops::Linear gu = random_linear(2 * inter, kHidden, 3, false);
  const slope::ops::Linear dn = random_linear(kHidden, inter, 5, false);
  const auto x = random_floats(size_t(tokens * kHidden), 2);
  std::vector<float> mid(size_t(tokens * 2 * inter)), act(size_t(tokens * inter)), h(size_t(tokens * kHidden));
  auto mlp = [&] {
    gu.forward(x.data(), tokens, mid.data());
    ops.swiglu_oai(mid.data(), tokens, inter, kAlpha, kLimit, act.data());
    dn.forward(act.data(), tokens, h.data());
  };
  mlp();
  for (auto _ : state) {
    mlp();
    benchmark::DoNotOptimize(h.data());
  }
  set_rate(state, tokens);
}
BENCHMARK(BM_DenseMlpSameFlops)->ArgName("tokens")->Arg(1024)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
