// Cost-model arithmetic against values worked out by hand (in the comments), the gpt-oss-120b
// counts of shared/reference/gpt-oss-model.md section 7, and monotonicity properties.
#include <gtest/gtest.h>

#include <cmath>

#include "planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/cost_model.h"

namespace slope::planner {
namespace {

using testing::gpt_oss_120b;
using testing::round_profile;
using testing::tiny_dense;
using testing::tiny_moe;

// Relative comparison for sums of doubles.
void expect_rel(double got, double want, double rel = 1e-9) {
  EXPECT_NEAR(got, want, std::abs(want) * rel) << "got " << got << ", want " << want;
}

TEST(CostModelFlops, TinyDenseLinearAndPairs) {
  auto c = tiny_dense();
  // attention projections 2·(64·64 + 2·64·32 + 64·64) = 24576, MLP 2·3·64·32 = 12288.
  EXPECT_DOUBLE_EQ(linear_flops_per_token_layer(c), 36864);
  // 4 heads · 16 · 4 = 256 per (query, key) pair.
  EXPECT_DOUBLE_EQ(attention_flops_per_pair(c), 256);
  // Full causal over 10 queries: 1 + 2 + ... + 10 = 55.
  EXPECT_DOUBLE_EQ(attention_pairs(0, 10, 0), 55);
  // Window 4 over positions 0..9: 1 + 2 + 3 + 4·7 = 34.
  EXPECT_DOUBLE_EQ(attention_pairs(0, 10, 4), 34);
  // A chunk [5, 10) sees 6+7+8+9+10 = 40 keys fully, 4·5 = 20 with window 4.
  EXPECT_DOUBLE_EQ(attention_pairs(5, 10, 0), 40);
  EXPECT_DOUBLE_EQ(attention_pairs(5, 10, 4), 20);
  // Chunk [2, 6) with window 4: 3 + 4 + 4 + 4 = 15.
  EXPECT_DOUBLE_EQ(attention_pairs(2, 6, 4), 15);
  EXPECT_DOUBLE_EQ(attention_pairs(3, 3, 0), 0);
  // lm_head: 2·64·100.
  EXPECT_DOUBLE_EQ(lm_head_flops_per_token(c), 12800);

  FlopCount f = prefill_flop_count(c, 10);
  EXPECT_DOUBLE_EQ(f.linear, 36864.0 * 2 * 10);
  EXPECT_DOUBLE_EQ(f.attention_full, 55.0 * 256);
  EXPECT_DOUBLE_EQ(f.attention_sliding, 34.0 * 256);
  EXPECT_DOUBLE_EQ(f.lm_head, 12800);
}

TEST(CostModelFlops, TinyMoeLinear) {
  // attention 24576 + router 2·64·8 = 1024 + 2 experts · 2·3·64·32 = 24576 → 50176.
  EXPECT_DOUBLE_EQ(linear_flops_per_token_layer(tiny_moe()), 50176);
}

TEST(CostModelBytes, TinyWeightsAndKv) {
  WeightBytes d = weight_bytes(tiny_dense());
  EXPECT_DOUBLE_EQ(d.attention_per_layer, 2.0 * 12288);  // 64·64 + 2·64·32 + 64·64 params, bf16
  EXPECT_DOUBLE_EQ(d.mlp_per_layer, 2.0 * 3 * 64 * 32);  // 12288 B
  EXPECT_DOUBLE_EQ(d.norms_per_layer, 4.0 * 2 * 64);     // two fp32 norms
  EXPECT_DOUBLE_EQ(d.embedding, 2.0 * 100 * 64);
  EXPECT_DOUBLE_EQ(d.lm_head, 2.0 * 100 * 64);
  EXPECT_DOUBLE_EQ(d.total(2), 2 * (24576 + 12288 + 512) + 12800 + 12800 + 256);  // 100608

  WeightBytes m = weight_bytes(tiny_moe());
  // One expert: 3·64·32 = 6144 MXFP4 params · 4.25/8 = 3264 B, biases (2·32 + 64)·2 = 256 B.
  EXPECT_DOUBLE_EQ(m.expert_bytes, 3520);
  EXPECT_DOUBLE_EQ(m.mlp_per_layer, 8 * 3520);
  EXPECT_DOUBLE_EQ(m.router_per_layer, 2.0 * (8 * 64 + 8));

  // K and V, 2 heads of 16, bf16: 128 B per token per layer.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token_layer(tiny_dense()), 128);
}

TEST(CostModelPredict, SingleRankByHand) {
  // N = 1000 on one rank of the round profile (matmul 1e12 FLOP/s, attention 5e11, memory
  // 1e12 B/s). Per layer, all GEMMs compute-bound:
  //   projections 1000·24576 FLOP = 24.576 us; MLP 1000·12288 = 12.288 us → 36.864 us;
  //   element-wise 1000·4·(8·64 + 2·6·16 + 3·32) B = 3.2 MB → 3.2 us.
  // Full layer: 500500 pairs · 256 / 5e11 = 256.256 us.
  // Sliding layer: (1+2+3 + 4·997) · 256 / 5e11 = 2.044928 us (its 0.512 MB of q,k,v reads
  // take 0.512 us, so compute-bound).
  // lm_head: 12800 FLOP and 12800 B → 0.0128 us.
  // TTFT = 2·36.864 + 2·3.2 + 256.256 + 2.044928 + 0.0128 = 338.441728 us.
  Prediction p = predict(tiny_dense(), round_profile(), Mesh{}, 1000);
  expect_rel(p.ttft_s, 338.441728e-6);
  expect_rel(p.phases.linear, 73.728e-6);
  expect_rel(p.phases.elementwise, 6.4e-6);
  expect_rel(p.phases.attention, (256.256 + 2.044928) * 1e-6);
  expect_rel(p.phases.lm_head, 0.0128e-6);
  EXPECT_EQ(p.phases.ulysses + p.phases.ring_exposed + p.phases.halo + p.phases.tp_allreduce + p.phases.pipeline_fill, 0);
  expect_rel(p.service_s, p.ttft_s);
  // FLOPs: 2·36864·1000 + (500500 + 3994)·256 + 12800 = 73,728,000 + 129,150,464 + 12,800
  // = 202,891,264.
  expect_rel(p.flops_per_rank, 202891264);

  // Memory: weights 100608 B; KV 1000 tokens · 128 B (full layer) + 4 · 128 (sliding keeps
  // the last W); activations per token 4·3·64 + 2·2·(4+4)·16 + 4·4·16 + 4·3·32 + 2·64·2 =
  // 2176 B → 2,176,000 + fp32 logits 400.
  expect_rel(p.memory.weights, 100608);
  expect_rel(p.memory.kv_cache, 128512);
  EXPECT_EQ(p.memory.attention_workspace, 0);
  expect_rel(p.memory.activations, 2176400);
  expect_rel(p.memory.total(), 2405520);
  EXPECT_TRUE(p.fits);  // 2.4 MB of 1 GB
  EXPECT_FALSE(predict(tiny_dense(), round_profile(0.002), Mesh{}, 1000).fits);  // 2 MB
}

TEST(CostModelPredict, UlyssesRingHaloByHand) {
  // U2 R2 on 1000 tokens: 250 tokens per rank; per Ulysses rank 2 query heads and 1 KV head.
  Prediction p = predict(tiny_dense(), round_profile(), Mesh{1, 2, 2, 1, 0}, 1000);
  // Ulysses, per full layer: 250 tokens · 16 · 2 B · (U-1) · (2·2 q/o heads + 2·1 k/v heads)
  // = 48,000 B at 1 GB/s + 2 · 2 us = 52 us.
  expect_rel(p.ulysses_bytes, 48000);
  expect_rel(p.phases.ulysses, 52e-6);
  // Ring inside the node (4 ranks of 8) over p2p 0.5 GB/s + 1 us: block = 500 tokens · 1 head
  // · 16 · 2 (K, V) · 2 B = 32,000 B → 64 us; attention 128.128 MFLOP / 4 ranks / 5e11 =
  // 64.064 us, per step 32.032 us. Ring = 32.032 + (64 + 1) = 97.032 us, of which
  // 97.032 - 64.064 = 32.968 us is exposed.
  expect_rel(p.ring_bytes, 32000);
  expect_rel(p.phases.ring_exposed, 32.968e-6);
  // Halo: 2 zigzag segments · 3 tokens · 2 KV heads · 16 · 2 · 2 B = 768 B, each segment
  // 1 us + 384 B / 0.5 GB/s = 1.768 us.
  expect_rel(p.halo_bytes, 768);
  expect_rel(p.phases.halo, 3.536e-6);
  // FLOPs per rank: 250·36864·2 + 500500·256/4 + 3994·256/4 + 12800 = 50,732,416.
  expect_rel(p.flops_per_rank, 50732416);
  // KV: 250 tokens · 128 B + 4 · 128 (sliding); workspace: gathered K/V 500 · 1 · 16 · 2 · 2
  // = 32,000 B plus two ring buffers of the same size.
  expect_rel(p.memory.kv_cache, 32512);
  expect_rel(p.memory.attention_workspace, 96000);
}

TEST(CostModelPredict, TensorParallelAllReduceByHand) {
  // TP2: each rank keeps all 1000 tokens; two all-reduces per layer of 1000·64·2 B = 128 KB,
  // moving 2·(2-1)/2 of it each → 128,000 B; 4 in total = 512,000 B at 1 GB/s bus + 3 us.
  Prediction p = predict(tiny_dense(), round_profile(), Mesh{1, 1, 1, 2, 0}, 1000);
  expect_rel(p.allreduce_bytes, 512000);
  expect_rel(p.phases.tp_allreduce, 4 * (128e-6 + 3e-6));
}

TEST(CostModelPredict, ChunkedPipelineByHand) {
  // P2 with 2 chunks of 500: stage 0 = layer 0 (sliding) + embedding, stage 1 = layer 1 (full)
  // + lm_head. Per chunk and layer: linear 500·36864 FLOP = 18.432 us, element-wise 1.6 us.
  //   stage 0: chunk 0 sliding (1+2+3 + 4·497)·256/5e11 = 1.020928 us → 21.052928 us;
  //            chunk 1 sliding 4·500·256/5e11 = 1.024 us → 21.056 us.
  //   stage 1: chunk 0 full 125250·256/5e11 = 64.128 us → 84.16 us;
  //            chunk 1 full 375250·256/5e11 = 192.128 us, + lm_head 0.0128 → 212.1728 us.
  // Hop inside the node: 1 us + 500·64·2 B / 0.5 GB/s = 129 us.
  // Flow shop: stage 1 starts chunk 0 at 21.052928 + 129 = 150.052928, ends 234.212928;
  // chunk 1 ready at 42.108928 + 129 = 171.108928 but the stage is busy until 234.212928,
  // so it ends at 446.385728 us. Busiest stage: 296.3328 us; fill = 150.052928 us.
  Prediction p = predict(tiny_dense(), round_profile(), Mesh{2, 1, 1, 1, 500}, 1000);
  EXPECT_EQ(p.chunks, 2);
  expect_rel(p.ttft_s, 446.385728e-6);
  expect_rel(p.service_s, 296.3328e-6);
  expect_rel(p.phases.pipeline_fill, 150.052928e-6);
  expect_rel(p.phases.total(), p.ttft_s);
  // Fullest rank is stage 1: weights 37376 + lm_head 12800 + final norm 256; KV 1000 · 128;
  // activations for a 500-token chunk 500 · 2176 + 400.
  expect_rel(p.memory.weights, 50432);
  expect_rel(p.memory.kv_cache, 128000);
  expect_rel(p.memory.total(), 50432 + 128000 + 1088400);
}

TEST(CostModelGptOss, ReproducesSection7) {
  auto c = gpt_oss_120b();
  // Per token per layer: attention 2·(2880·4096 + 2·2880·512 + 4096·2880) = 53,084,160;
  // router 2·2880·128 = 737,280; 4 experts · 2·(2880·5760 + 2880·2880) = 199,065,600.
  EXPECT_DOUBLE_EQ(linear_flops_per_token_layer(c), 252887040);
  EXPECT_NEAR(linear_flops_per_token_layer(c) * 36 / 1e9, 9.10, 0.005);   // GFLOP/token
  EXPECT_NEAR((linear_flops_per_token_layer(c) * 36 + lm_head_flops_per_token(c)) / 1e9, 10.26, 0.005);
  EXPECT_DOUBLE_EQ(attention_flops_per_pair(c), 16384);

  struct Row { int64_t n; double full, sliding, linear, total; };
  // Section 7's table, TFLOP. Its sliding column uses ≈ 128·N pairs per layer; the model
  // counts the first 127 queries' shorter windows exactly, 0.2% less at 32K.
  const Row rows[] = {{32768, 158.3, 1.24, 298.3, 457.9},
                      {65536, 633.3, 2.47, 596.6, 1232.4},
                      {100000, 1474.6, 3.77, 910.4, 2388.7}};
  for (const Row& r : rows) {
    FlopCount f = prefill_flop_count(c, r.n);
    EXPECT_NEAR(f.attention_full / 1e12, r.full, 0.05) << r.n;
    EXPECT_NEAR(f.attention_sliding / 1e12, r.sliding, r.sliding * 0.005) << r.n;
    EXPECT_NEAR(f.linear / 1e12, r.linear, 0.05) << r.n;
    EXPECT_NEAR((f.linear + f.attention_full + f.attention_sliding) / 1e12, r.total, 0.1) << r.n;
  }
  // KV: 18 full layers · 2048 B = 36 KiB per token.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token_layer(c) * 18, 36 * 1024);
}

TEST(CostModelGptOss, WeightBytes) {
  WeightBytes w = weight_bytes(gpt_oss_120b());
  // One expert: 3·2880·2880 = 24,883,200 params · 4.25/8 = 13,219,200 B + biases
  // (5760 + 2880)·2 = 17,280 B.
  EXPECT_DOUBLE_EQ(w.expert_bytes, 13236480);
  // Attention: 26,542,080 weights + (4096 + 1024) qkv bias + 2880 o bias + 64 sinks, bf16.
  EXPECT_DOUBLE_EQ(w.attention_per_layer, 2.0 * 26550144);
  // Whole model ≈ 65.3 GB: more than one 64 GB MI250 GCD, so P or TP >= 2 there.
  EXPECT_NEAR(w.total(36) / 1e9, 65.25, 0.05);
}

TEST(CostModelMesh, RejectsImpossibleMeshes) {
  auto c = gpt_oss_120b();
  auto hw = round_profile();
  EXPECT_EQ(mesh_problem(c, hw, Mesh{1, 4, 8, 1, 0}), "");
  EXPECT_NE(mesh_problem(c, hw, Mesh{1, 1, 16, 1, 0}), "");  // Ulysses beyond a node of 8
  EXPECT_NE(mesh_problem(c, hw, Mesh{1, 1, 3, 1, 0}), "");   // 3 does not divide 64 heads
  EXPECT_NE(mesh_problem(c, hw, Mesh{37, 1, 1, 1, 0}), "");  // more stages than layers
  EXPECT_NE(mesh_problem(c, hw, Mesh{1, 1, 0, 1, 0}), "");
  EXPECT_THROW(predict(c, hw, Mesh{1, 1, 3, 1, 0}, 1000), Error);
  EXPECT_THROW(predict(c, hw, Mesh{}, 0), Error);
}

// The planner refuses exactly what the engine refuses (model::mesh_problem, in the engine's
// words), and adds only the node constraint: a TP degree that splits the heads but not the MLP
// columns was once accepted by the planner and refused by the engine.
TEST(CostModelMesh, RefusesWhatTheEngineRefuses) {
  auto c = gpt_oss_120b();
  auto hw = round_profile();
  c.intermediate_size = 2884;  // 64 heads and 8 KV heads split 8 ways, 2884 columns do not
  for (const Mesh& m : {Mesh{1, 1, 1, 8, 0}, Mesh{1, 2, 1, 8, 0}, Mesh{1, 1, 3, 1, 0}, Mesh{37, 1, 1, 1, 0}}) {
    EXPECT_NE(model::mesh_problem(m, c), "") << m.str();
    EXPECT_EQ(mesh_problem(c, hw, m), model::mesh_problem(m, c)) << m.str();
  }
  EXPECT_NE(mesh_problem(c, hw, Mesh{1, 1, 1, 8, 0}).find("intermediate size 2884"), std::string::npos);
  EXPECT_EQ(model::mesh_problem(Mesh{1, 1, 1, 4, 0}, c), "");
  EXPECT_EQ(mesh_problem(c, hw, Mesh{1, 1, 1, 4, 0}), "");
}

TEST(CostModelProperties, MoreRanksNeverMoreComputePerRank) {
  auto c = gpt_oss_120b();
  auto hw = load_profile(testing::source_root() + "/profiles/mi250-gcd.json");
  for (int64_t n : {4096, 32768, 100000}) {
    double prev = predict(c, hw, Mesh{}, n).flops_per_rank;
    for (Mesh m : {Mesh{1, 1, 2, 1, 0}, Mesh{1, 1, 4, 1, 0}, Mesh{1, 1, 8, 1, 0}, Mesh{1, 2, 8, 1, 0},
                   Mesh{1, 4, 8, 1, 0}, Mesh{2, 4, 8, 1, 0}, Mesh{4, 4, 8, 1, 0}}) {
      double f = predict(c, hw, m, n).flops_per_rank;
      EXPECT_LE(f, prev * (1 + 1e-12)) << mesh_name(m) << " at " << n;
      prev = f;
    }
    // Each axis alone, from one rank.
    const double one = predict(c, hw, Mesh{}, n).flops_per_rank;
    for (Mesh m : {Mesh{1, 4, 1, 1, 0}, Mesh{4, 1, 1, 1, 0}, Mesh{1, 1, 1, 4, 0}, Mesh{4, 1, 1, 1, 1024}})
      EXPECT_LE(predict(c, hw, m, n).flops_per_rank, one) << mesh_name(m) << " at " << n;
  }
}

TEST(CostModelProperties, LongerPromptsNeverShorterTtft) {
  auto c = gpt_oss_120b();
  auto hw = load_profile(testing::source_root() + "/profiles/mi250-gcd.json");
  for (Mesh m : {Mesh{}, Mesh{1, 1, 8, 1, 0}, Mesh{1, 4, 8, 1, 0}, Mesh{2, 2, 4, 1, 8192}, Mesh{1, 1, 1, 8, 0},
                 Mesh{2, 2, 8, 1, 0}}) {
    double prev = 0;
    for (int64_t n = 1024; n <= 131072; n += 4096) {
      Prediction p = predict(c, hw, m, n);
      EXPECT_GE(p.ttft_s, prev) << mesh_name(m) << " at " << n;
      EXPECT_NEAR(p.phases.total(), p.ttft_s, 1e-9 * p.ttft_s) << mesh_name(m);
      EXPECT_LE(p.service_s, p.ttft_s * (1 + 1e-12));
      prev = p.ttft_s;
    }
  }
}

}  // namespace
}  // namespace slope::planner
