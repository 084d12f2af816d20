// The bf16 units' choice (kernels/bf16_units.h) and the probe it is made from: bench/peak.cpp's
// chains (kernels/cpu/unit_chain.h) on one thread, long enough to time (about 0.1 ms a round)
// and short enough to run at every start.
#include "slope/kernels/bf16_units.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "slope/core/error.h"
#include "slope/kernels/cpu/amx.h"
#include "slope/kernels/cpu/unit_chain.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/gemm.h"

namespace slope::kernels {
namespace {

#if defined(__AVX512F__)
constexpr int64_t kIters = 4096;
constexpr double kChainInstructions = double(kIters) * cpu::kChainAccumulators;

// Seconds for one chain of kChainInstructions (vdpbf16ps with kBf16, else vfmadd231ps).
template <bool kBf16>
double time_chain() {
  const auto t0 = std::chrono::steady_clock::now();
  volatile float sink = cpu::unit_chain<kBf16>(kIters);
  (void)sink;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
#endif

Bf16UnitFacts measure() {
  Bf16UnitFacts f;
  f.bf16_matmul = native_bf16_matmul_supported();
  f.amx = cpu::amx_usable();
  f.dot = bf16_attention_supported();  // the CPU and the build have vdpbf16ps
#if defined(__AVX512F__)
  // Rounds alternate the two chains, so a neighbour's burst slows both; each keeps its best.
  // The first round also brings the core to its AVX-512 clock.
  double fma_s = 1e30, dot_s = 1e30;
  for (int round = 0; round < 8; ++round) {
    fma_s = std::min(fma_s, time_chain<false>());
#if defined(__AVX512BF16__)
    if (f.dot) dot_s = std::min(dot_s, time_chain<true>());
#endif
  }
  f.fma_gflops = kChainInstructions * 32 / fma_s / 1e9;
  if (f.dot) f.dot_gflops = kChainInstructions * 64 / dot_s / 1e9;
#endif
  return f;
}

std::atomic<Bf16Units> g_units{Bf16Units::Auto};

struct Decision {
  Bf16Units units;
  std::string why;
};

// choose_bf16_units's rule, with the reason describe_bf16_units reports.
Decision decide(const Bf16UnitFacts& f) {
  if (!f.bf16_matmul) return {Bf16Units::F32, "oneDNN has no bf16 matmul on this CPU"};
  if (f.amx) return {Bf16Units::Bf16, "AMX tiles"};
  if (!f.dot) return {Bf16Units::F32, "no vdpbf16ps on this CPU or build"};
  return {f.dot_gflops >= f.fma_gflops ? Bf16Units::Bf16 : Bf16Units::F32,
          str_cat("one thread measured vdpbf16ps at ", int(f.dot_gflops), " GFLOP/s, vfmadd231ps at ",
                  int(f.fma_gflops))};
}

}  // namespace

const Bf16UnitFacts& bf16_unit_facts() {
  static const Bf16UnitFacts facts = measure();
  return facts;
}

Bf16Units choose_bf16_units(const Bf16UnitFacts& f) { return decide(f).units; }

void set_bf16_units(Bf16Units units) { g_units.store(units); }

Bf16Units bf16_units() {
  const Bf16Units u = g_units.load();
  if (u != Bf16Units::Auto) return u;
  static const Bf16Units chosen = choose_bf16_units(bf16_unit_facts());
  return chosen;
}

const char* bf16_units_name(Bf16Units units) {
  switch (units) {
    case Bf16Units::Bf16: return "bf16";
    case Bf16Units::F32: return "f32";
    default: return "auto";
  }
}

Bf16Units parse_bf16_units(const std::string& name) {
  if (name == "auto") return Bf16Units::Auto;
  if (name == "bf16") return Bf16Units::Bf16;
  if (name == "f32") return Bf16Units::F32;
  fail("bf16 units must be auto, bf16 or f32, got '", name, "'");
}

std::string describe_bf16_units() {
  const Bf16Units u = bf16_units();
  const std::string why = g_units.load() != Bf16Units::Auto ? "as asked" : decide(bf16_unit_facts()).why;
  return str_cat(bf16_units_name(u), " units (",
                 u == Bf16Units::Bf16 ? "oneDNN's bf16 matmul, the bf16 attention kernel"
                                      : "f32 copies of the bf16 weights, the f32 attention kernel",
                 "): ", why);
}

}  // namespace slope::kernels
