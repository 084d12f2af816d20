// The planner and the engine agree: every deployment the planner lists for a shipped model is a
// mesh the engine accepts, and for that mesh both count the same FLOPs, the same K/V per rank and
// the same linear weights per rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner_fixtures.h"
#include "slope/engine/prefill.h"
#include "slope/engine/topology.h"
#include "slope/kernels/attention.h"
#include "slope/model/config.h"
#include "slope/planner/cost_model.h"
#include "slope/planner/plan.h"

namespace slope::planner {
namespace {

const std::vector<std::string> kConfigs = {"gpt-oss-120b", "gpt-oss-20b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-8b"};

model::ModelConfig shipped_config(const std::string& name) {
  return model::load_config(testing::source_root() + "/configs/" + name);
}

HardwareProfile shipped_profile(const std::string& name) {
  return load_profile(testing::source_root() + "/profiles/" + name + ".json");
}

struct Case {
  std::string profile;
  Cluster cluster;
};
const std::vector<Case> kClusters = {{"mi250-gcd", {1, 8}}, {"mi250-gcd", {4, 8}}, {"h100-sxm", {2, 4}},
                                     {"h100-sxm", {1, 8}}};

std::vector<Deployment> deployments(const model::ModelConfig& cfg, const Case& c, int64_t tokens) {
  PlanOptions opt;
  opt.contexts = {tokens};
  opt.ttft_slo_s = 1e9;
  opt.max_listed = 100000;
  return enumerate_deployments(cfg, shipped_profile(c.profile), c.cluster, tokens, opt);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1.0); }

TEST(Agreement, EveryPlannedMeshPassesTheEngineValidator) {
  int checked = 0;
  for (const std::string& name : kConfigs) {
    const model::ModelConfig cfg = shipped_config(name);
    for (const Case& c : kClusters)
      for (const Deployment& d : deployments(cfg, c, 16384)) {
        EXPECT_NO_THROW(engine::validate_shape(d.mesh, d.mesh.size(), cfg, 16384))
            << name << " " << d.name() << " on " << c.profile;
        ++checked;
      }
  }
  EXPECT_GT(checked, 100);
}

// The planner's FLOPs over all ranks equal the engine's prefill_flops for the same mesh, apart
// from one replication the planner counts on purpose: every tensor rank runs the whole router.
// The engine's attention count (the closed form in model/flops.h) is checked against the
// kernel's own exact count of what flash_attention visits, an independent reference.
TEST(Agreement, PlannerAndEngineCountTheSameFlops) {
  int checked = 0;
  for (const std::string& name : kConfigs) {
    const model::ModelConfig cfg = shipped_config(name);
    for (int64_t n : {int64_t(1000), int64_t(16384)}) {
      const kernels::AttentionShape shape{cfg.num_heads, cfg.num_kv_heads, cfg.head_dim};
      for (int64_t l = 0; l < cfg.num_layers; ++l) {
        const double linear = model::linear_flops_per_token_layer(cfg) * double(n);
        const kernels::AttentionMask mask{true, cfg.layer_window.empty() ? 0 : cfg.layer_window[size_t(l)]};
        EXPECT_LE(rel(engine::layer_flops(cfg, l, n) - linear, kernels::attention_flops(n, 0, n, 0, shape, mask)), 1e-12)
            << name << " layer " << l;
      }
      const double engine_total = engine::prefill_flops(cfg, n);
      EXPECT_LE(rel(prefill_flop_count(cfg, n).total(), engine_total), 1e-12) << name;
      for (const Case& c : kClusters)
        for (const Deployment& d : deployments(cfg, c, n)) {
          const Prediction p = predict(cfg, shipped_profile(c.profile), d.mesh, n);
          const double router_copies = double(d.mesh.tp - 1) * model::router_flops_per_token_layer(cfg) *
                                       double(cfg.num_layers) * double(n);
          EXPECT_LE(rel(p.flops_total, engine_total + router_copies), 1e-9)
              << name << " " << d.name() << " " << n << " tokens: planner " << p.flops_total << ", engine "
              << engine_total;
          ++checked;
        }
    }
  }
  EXPECT_GT(checked, 200);
}

// Memory of one rank, for single-stage meshes (the planner splits layers evenly over stages, the
// engine balances them by FLOPs, so the fullest stage can hold different layers).
//  - K/V: the engine holds every row of its shard in f32 for all layers; the planner keeps bf16,
//    and for sliding layers only the last W tokens (what a decode engine needs). Compared: the
//    planner's bytes against the engine's elements per token and layer, counted the planner's way.
//  - Linear weights: the engine's packed q/k/v/o, router and expert (MLP) elements of one layer
//    on a tensor rank, taken as the difference of its f32 and bf16 estimates (only packed
//    weights change size), against the planner's bf16 bytes of the same matrices. Compared for
//    the models without biases or MXFP4 experts (llama, qwen3), where the planner's per-layer
//    bytes are exactly those matrices: the planner stores biases in bf16 inside its attention
//    bytes and MXFP4 experts at 4.25 bits, while the engine keeps biases f32 and dequantises.
//  - Embedding and lm_head: PlannerAndEngineHoldTheSameWeightsPerRank below.
TEST(Agreement, PlannerAndEngineCountTheSameKvAndWeightsPerRank) {
  int kv_checked = 0, weights_checked = 0;
  for (const std::string& name : kConfigs) {
    const model::ModelConfig cfg = shipped_config(name);
    const bool plain = !cfg.is_moe() && !cfg.qkv_bias && !cfg.o_bias && !cfg.sinks && !cfg.mxfp4_experts;
    const int64_t n = 16384;  // divisible by 2·R·U of every mesh here: equal rows on every rank
    for (const Case& c : kClusters)
      for (const Deployment& d : deployments(cfg, c, n)) {
        if (d.mesh.pp != 1) continue;
        const Prediction p = predict(cfg, shipped_profile(c.profile), d.mesh, n);
        engine::MemoryQuery q;
        q.shape = d.mesh;
        q.num_tokens = n;
        q.bf16_weights = true;
        const std::vector<engine::RankMemory> bf16 = engine::estimate_memory(cfg, q);
        q.bf16_weights = false;
        const std::vector<engine::RankMemory> f32 = engine::estimate_memory(cfg, q);
        ASSERT_EQ(int(bf16.size()), d.mesh.size());
        const engine::RankMemory& r = bf16[0];
        const double L = double(cfg.num_layers), tokens = double(r.tokens);
        ASSERT_EQ(r.tokens * d.mesh.cp_size(), n) << d.name();
        const double kv_elems = double(r.kv) / 4 / tokens / L;  // per token and layer, this rank's heads
        double full = 0, sliding = 0;
        int64_t window = 0;
        for (int64_t l = 0; l < cfg.num_layers; ++l) {
          const int64_t w = cfg.layer_window.empty() ? 0 : cfg.layer_window[size_t(l)];
          (w > 0 ? sliding : full) += 1;
          window = std::max(window, w);
        }
        const double planner_kv = 2 * kv_elems * (full * tokens + sliding * std::min(double(window), tokens));
        EXPECT_LE(rel(p.memory.kv_cache, planner_kv), 1e-12) << name << " " << d.name();
        ++kv_checked;
        if (!plain) continue;
        const double packed_per_layer =
            (double(f32[0].weights - r.weights) / 2 - double(cfg.vocab_size) * double(cfg.hidden_size)) / L;
        const WeightBytes wb = weight_bytes(cfg);
        EXPECT_LE(rel(2 * packed_per_layer, (wb.attention_per_layer + wb.mlp_per_layer) / d.mesh.tp), 1e-12)
            << name << " " << d.name();
        ++weights_checked;
      }
  }
  EXPECT_GT(kv_checked, 50);
  EXPECT_GT(weights_checked, 10);
}

// All of a rank's weights, embedding and lm_head included, for every single-stage deployment of the
// models whose per-layer bytes the two count alike (above): the engine keeps the embedding whole
// on the first stage and packs lm_head whole on tensor rank 0 of the last, and the planner must
// count the same (it once split both over the tensor group: 46% low for llama-3.1-8b at TP8).
// Left between them: the f32 norms the engine keeps per layer (well under 0.1% here).
TEST(Agreement, PlannerAndEngineHoldTheSameWeightsPerRank) {
  int checked = 0;
  for (const std::string& name : kConfigs) {
    const model::ModelConfig cfg = shipped_config(name);
    if (cfg.is_moe() || cfg.qkv_bias || cfg.o_bias || cfg.sinks || cfg.mxfp4_experts) continue;
    const int64_t n = 16384;
    for (const Case& c : kClusters)
      for (const Deployment& d : deployments(cfg, c, n)) {
        if (d.mesh.pp != 1) continue;
        const Prediction p = predict(cfg, shipped_profile(c.profile), d.mesh, n);
        engine::MemoryQuery q;
        q.shape = d.mesh;
        q.num_tokens = n;
        q.bf16_weights = true;
        const std::vector<engine::RankMemory> ranks = engine::estimate_memory(cfg, q);
        int64_t fullest = 0;
        for (const engine::RankMemory& r : ranks) fullest = std::max(fullest, r.weights);
        EXPECT_EQ(ranks[0].weights, fullest) << name << " " << d.name() << ": tensor rank 0 holds lm_head";
        EXPECT_LE(rel(p.memory.weights, double(fullest)), 1e-3) << name << " " << d.name() << " on " << c.profile;
        ++checked;
      }
  }
  EXPECT_GT(checked, 10);
}

// Pipeline stages: the planner predicts the engine's own split (balanced by FLOPs, not even), so
// the K/V and the layers of the stage it calls fullest are the engine's.
TEST(Agreement, PlannerAndEngineSplitStagesAlike) {
  int checked = 0;
  for (const std::string& name : kConfigs) {
    const model::ModelConfig cfg = shipped_config(name);
    const int64_t n = 16384;
    for (const Case& c : kClusters)
      for (const Deployment& d : deployments(cfg, c, n)) {
        if (d.mesh.pp == 1) continue;
        const Prediction p = predict(cfg, shipped_profile(c.profile), d.mesh, n);
        engine::MemoryQuery q;
        q.shape = d.mesh;
        q.num_tokens = n;
        q.bf16_weights = true;
        // The engine's largest K/V of a rank, counted the planner's way (bf16, last W of sliding
        // layers), against the planner's fullest rank's K/V.
        double most = 0;
        for (const engine::RankMemory& r : engine::estimate_memory(cfg, q)) {
          double full = 0, sliding = 0;
          int64_t window = 0;
          for (int l = r.first_layer; l < r.last_layer; ++l) {
            const int64_t w = model::layer_window(cfg, l);
            (w > 0 ? sliding : full) += 1;
            window = std::max(window, w);
          }
          const double per_token_layer = double(r.kv) / 4 / double(r.tokens) / double(r.last_layer - r.first_layer);
          const double t = double(r.tokens);
          most = std::max(most, 2 * per_token_layer * (full * t + sliding * std::min(double(window), t)));
        }
        EXPECT_LE(rel(p.memory.kv_cache, most), 1e-9) << name << " " << d.name() << " on " << c.profile;
        ++checked;
      }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace slope::planner
