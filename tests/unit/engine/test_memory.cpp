// The memory prediction (engine/topology.h estimate_memory) against what a prefill holds: the
// attention kernel's K/V copies, which it keeps on the prefill's thread between calls, are at most
// the prediction's attention_kept for that rank, and not nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "slope/engine/prefill.h"
#include "slope/engine/topology.h"
#include "slope/kernels/attention.h"
#include "slope/kernels/gemm.h"
#include "slope/model/model.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

// One prefill of n tokens on a fresh thread (so that nothing an earlier call kept is counted):
// the bytes the attention kernels keep on it afterwards.
int64_t kept_after_prefill(const model::Model& m, int64_t n) {
  int64_t kept = -1;
  std::thread([&] {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 37 + 11) % m.config().vocab_size);
    ops::LocalAttention runner;
    engine::PrefillOptions po;
    po.chunk_tokens = 64;  // several chunks: later ones see more keys
    engine::prefill(m, tokens, ops::SequenceShard::whole(n), runner, po);
    kept = kernels::attention_kept_bytes();
  }).join();
  return kept;
}

TEST(MemoryPrediction, CountsTheAttentionKernelsKeptCopies) {
  struct Mode {
    kernels::ComputeType compute;
    kernels::Bf16Units units;
  };
  std::vector<Mode> modes{{kernels::ComputeType::F32, kernels::Bf16Units::F32},
                          {kernels::ComputeType::BF16, kernels::Bf16Units::F32}};
  if (kernels::native_bf16_matmul_supported()) modes.push_back({kernels::ComputeType::BF16, kernels::Bf16Units::Bf16});
  const std::string dir = (fs::path(SLOPE_REFERENCE_DIR) / "fixtures" / "gpt_oss" / "model").string();
  for (const Mode& mode : modes) {
    kernels::set_bf16_units(mode.units);
    SCOPED_TRACE(std::string(mode.compute == kernels::ComputeType::F32 ? "f32" : "bf16") + " on the " +
                 kernels::bf16_units_name(kernels::bf16_units()) + " units");
    model::LoadOptions lo;
    lo.compute = mode.compute;
    const std::unique_ptr<model::Model> m = model::Model::load(dir, lo);
    ASSERT_GT(m->config().num_kv_heads, 1) << "the fixture must have several KV heads for the f32 kernel to copy";
    for (int64_t n : {100, 333}) {
      engine::MemoryQuery q;
      q.shape = engine::ParallelShape{1, 1, 1, 1};
      q.num_tokens = n;
      q.bf16_weights = engine::bf16_weights(mode.compute, kernels::bf16_units());
      const engine::RankMemory predicted = engine::estimate_memory(m->config(), q).at(0);
      const int64_t kept = kept_after_prefill(*m, n);
      EXPECT_GT(kept, 0) << n << " tokens";
      EXPECT_LE(kept, predicted.attention_kept) << n << " tokens";
      EXPECT_LE(predicted.attention_kept, predicted.activations);
    }
  }
  kernels::set_bf16_units(kernels::Bf16Units::Auto);
}

}  // namespace
