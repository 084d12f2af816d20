// The profile's "engine" object (how SLOPE's own kernels run on a device) and the cost-model
// terms it switches on: the attention dtype of bf16 mode, fp32 wire payloads, token-local work in
// row blocks, unfused element-wise bytes and flash-attention tile work; each against values
// worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/cost_model.h"

namespace slope::planner {
namespace {

using testing::round_profile_json;
using testing::tiny_dense;
using testing::tiny_moe;

void expect_rel(double got, double want, double rel = 1e-9) {
  EXPECT_NEAR(got, want, std::abs(want) * rel) << "got " << got << ", want " << want;
}

// The round profile plus an fp32 attention rate of 0.25 TFLOP/s, an fp32 matmul rate of
// 0.5 TFLOP/s and the given engine object.
HardwareProfile engine_profile(const std::string& engine) {
  std::string j = round_profile_json();
  const std::string mm = R"("matmul": {"bf16": {"peak_tflops": 2.0, "efficiency": 0.5}})";
  j.replace(j.find(mm), mm.size(),
            R"("matmul": {"bf16": {"peak_tflops": 2.0, "efficiency": 0.5},
                          "fp32": {"peak_tflops": 0.5, "efficiency": 1.0}})");
  const std::string attn = R"("attention": {"bf16": {"peak_tflops": 0.5, "efficiency": 1.0}})";
  j.replace(j.find(attn), attn.size(),
            R"("attention": {"bf16": {"peak_tflops": 0.5, "efficiency": 1.0},
                             "fp32": {"peak_tflops": 0.25, "efficiency": 1.0}})");
  const std::string tail = R"("sources")";
  j.replace(j.find(tail), tail.size(), "\"engine\": " + engine + ",\n    \"sources\"");
  return parse_profile(j, "engine.json");
}

TEST(AttentionTileWork, ByHand) {
  // 128 causal queries, 64 x 64 tiles: block 0 computes 1 tile (64 rows x 64 keys), block 1
  // two (64 x 128): 12,288; exact pairs 128·129/2 = 8,256; overhead 10 per row adds 1,280.
  expect_rel(attention_tile_work(0, 128, 0, 128, 0, 64, 64, 0), 12288);
  expect_rel(attention_tile_work(0, 128, 0, 128, 0, 64, 64, 10), 13568);
  expect_rel(attention_tile_work(0, 128, 0, 128, 0, 0, 0, 0), 8256);
  expect_rel(attention_pairs(0, 128, 0), 8256);
  // Window 4: short windows go by the kernel's 16-row query vectors whatever the tiles; rows
  // 0-7 are one vector, which sees keys 0-7: 8 x 8 = 64; exact Σ min(q+1, 4) = 1+2+3+4·5 = 26.
  expect_rel(attention_tile_work(0, 8, 0, 8, 4, 4, 4, 0), 64);
  expect_rel(attention_tile_work(0, 8, 0, 8, 4, 0, 0, 0), 26);
  // Window 128, 256 queries from 0: vector g (rows 16g .. 16g+15) sees keys max(0, 16g-127)
  // .. 16g+15: 16g+16 keys for g < 8, 143 after; 16·16·(1+..+8) + 8·16·143 = 9216 + 18304;
  // plus 2 per row. Exact: 128·129/2 + 128·128 = 24640.
  expect_rel(attention_tile_work(0, 256, 0, 256, 128, 64, 64, 0), 27520);
  expect_rel(attention_tile_work(0, 256, 0, 256, 128, 64, 64, 2), 27520 + 512);
  expect_rel(attention_tile_work(0, 256, 0, 256, 128, 0, 0, 0), 24640);
  // From position 1000 with the window's keys before it (a later chunk): every vector 143.
  expect_rel(attention_tile_work(1000, 1064, 0, 1064, 128, 64, 64, 0), 64 * 143);
  // Window 1024 and up: the 64 x 64 tiles. 128 queries from 0, window 1024: as causal.
  expect_rel(attention_tile_work(0, 128, 0, 128, 1024, 64, 64, 0), 12288);
  // Keys all before the queries: a rectangle, 10 x (50 + 3).
  expect_rel(attention_tile_work(100, 110, 0, 50, 0, 64, 64, 3), 530);
  // A narrow last tile: 64 queries, 40 keys (all before them under the causal mask... keys
  // 0..39 visible to rows 39..63; rows 0..38 see 1..39): one tile 40 keys wide, 64 x 40.
  expect_rel(attention_tile_work(0, 64, 0, 40, 0, 64, 64, 0), 2560);
  // Nothing visible: keys after the queries.
  EXPECT_EQ(attention_tile_work(0, 64, 64, 128, 0, 64, 64, 5), 0);
}

TEST(EngineSpec, DefaultPipelineChunkIsTheEngines) {
  EXPECT_EQ(default_pipeline_chunk(1, 4096), 0);
  EXPECT_EQ(default_pipeline_chunk(2, 4096), 512);    // ceil(4096 / 8)
  EXPECT_EQ(default_pipeline_chunk(2, 1000), 256);    // at least 256
  EXPECT_EQ(default_pipeline_chunk(4, 100001), 6251);  // ceil(100001 / 16)
}

TEST(EngineSpec, ParsesAndChecks) {
  HardwareProfile p = engine_profile(R"({"attention_dtype": "fp32", "wire_bytes": 4, "gemm_rows": 100,
      "unfused_elementwise": true, "attention_block_q": 64, "attention_block_k": 64,
      "attention_row_overhead": 56, "attention_calibrated_tokens": 4096, "message_overhead_us": 3})");
  EXPECT_TRUE(p.engine.present);
  EXPECT_EQ(p.engine.attention_dtype, "fp32");
  EXPECT_EQ(p.engine.wire_bytes, 4);
  EXPECT_EQ(p.engine.gemm_rows, 100);
  EXPECT_TRUE(p.engine.unfused_elementwise);
  EXPECT_EQ(p.engine.attention_block_q, 64);
  EXPECT_EQ(p.engine.attention_row_overhead, 56);
  EXPECT_EQ(p.engine.attention_calibrated_tokens, 4096);
  EXPECT_EQ(p.engine.message_overhead_us, 3);
  EXPECT_FALSE(testing::round_profile().engine.present);
  // Errors name the field.
  auto error_of = [](const std::string& engine) {
    try {
      engine_profile(engine);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(R"({"attention_dtype": "fp16"})").find("engine.attention_dtype"), std::string::npos);
  EXPECT_NE(error_of(R"({"attention_block_q": 64})").find("engine.attention_block_k"), std::string::npos);
  // Tiles of 1 and calibration at 10^9 tokens made one prediction take 10 s.
  EXPECT_NE(error_of(R"({"attention_block_q": 1, "attention_block_k": 1})").find("at least 8"), std::string::npos);
  EXPECT_NE(error_of(R"({"attention_block_q": 64, "attention_block_k": 64, "attention_calibrated_tokens": 1e9})")
                .find("engine.attention_calibrated_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"wire_bytes": -1})").find("engine.wire_bytes"), std::string::npos);
  EXPECT_NE(error_of(R"({"unfused_elementwise": 1})").find("engine.unfused_elementwise"), std::string::npos);
  EXPECT_NE(error_of(R"([1])").find("\"engine\""), std::string::npos);
}

TEST(EngineSpec, AttentionRunsInItsOwnDtype) {
  // tiny_dense, one rank, 1000 tokens: attention FLOPs 128.128 M (full) + 1.022 M (sliding,
  // window 4: 3994 pairs · 256) at 0.5 TFLOP/s (bf16) = 258.3 us; with fp32 attention at
  // 0.25 TFLOP/s twice that. Nothing else changes.
  const Prediction bf = predict(tiny_dense(), engine_profile("{}"), Mesh{}, 1000);
  const Prediction f32 = predict(tiny_dense(), engine_profile(R"({"attention_dtype": "fp32"})"), Mesh{}, 1000);
  expect_rel(bf.phases.attention, (128128000.0 + 3994 * 256) / 5e11);
  expect_rel(f32.phases.attention, 2 * bf.phases.attention);
  expect_rel(f32.phases.linear, bf.phases.linear);
  CostOptions generic;
  generic.use_engine_spec = false;
  expect_rel(predict(tiny_dense(), engine_profile(R"({"attention_dtype": "fp32"})"), Mesh{}, 1000, generic)
                 .phases.attention,
             bf.phases.attention);
}

TEST(EngineSpec, Fp32GemmsTakeFp32AttentionAndNotTheBf16Curve) {
  // An engine calibrated with its bf16 attention kernel (attention_dtype bf16), with a curve
  // measured with that kernel at 10x the device's bf16 rate; one full layer of tiny_dense (2 KV
  // heads, 256 FLOPs per pair), 512 tokens, tiles of 64 x 64 without row overhead.
  const HardwareProfile p = engine_profile(R"({"attention_dtype": "bf16", "attention_block_q": 64,
      "attention_block_k": 64, "attention_curve_kv_heads": 2,
      "attention_curve": [{"tokens": 512, "gflops": 5000}]})");
  model::ModelConfig c = tiny_dense();
  c.layer_window = {0};
  c.num_layers = 1;
  // bf16 GEMMs: the curve's rate, exact at its point.
  expect_rel(predict(c, p, Mesh{}, 512).phases.attention, 256.0 * attention_pairs(0, 512, 0) / 5e12);
  // fp32 GEMMs: the fp32 kernel at the device's fp32 attention rate (0.25 TFLOP/s) per tile.
  CostOptions f32;
  f32.compute_dtype = "fp32";
  expect_rel(predict(c, p, Mesh{}, 512, f32).phases.attention,
             256.0 * attention_tile_work(0, 512, 0, 512, 0, 64, 64, 0) / 2.5e11);
}

TEST(EngineSpec, WireBytesAndRowBlocks) {
  // Ulysses bytes scale with the bytes per element: 48,000 at bf16 (CostModelPredict.
  // UlyssesRingHaloByHand) → 96,000 at fp32.
  const Prediction u = predict(tiny_dense(), engine_profile(R"({"wire_bytes": 4})"), Mesh{1, 2, 2, 1, 0}, 1000);
  expect_rel(u.ulysses_bytes, 96000);
  // TP2 with blocks of 100 rows: 1000 tokens are 10 blocks, so each of the 4 all-reduces per
  // prefill (2 layers x 2) pays its 3 us latency 10 times; bytes unchanged (512,000).
  const Prediction t = predict(tiny_dense(), engine_profile(R"({"gemm_rows": 100})"), Mesh{1, 1, 1, 2, 0}, 1000);
  expect_rel(t.allreduce_bytes, 512000);
  expect_rel(t.phases.tp_allreduce, 4 * (128e-6 + 10 * 3e-6));
  // A message overhead adds to every latency: + 10 x 5 us per all-reduce.
  const Prediction m =
      predict(tiny_dense(), engine_profile(R"({"gemm_rows": 100, "message_overhead_us": 5})"), Mesh{1, 1, 1, 2, 0}, 1000);
  expect_rel(m.phases.tp_allreduce, 4 * (128e-6 + 10 * 8e-6));
  // A MoE layer's o_proj and MLP run in calls of moe_rows (250: 4 calls of 1000 tokens), so its
  // all-reduces pay the latency 4 times; tiny_moe has tiny_dense's hidden size and layers.
  const Prediction e = predict(tiny_moe(), engine_profile(R"({"gemm_rows": 100, "moe_rows": 250})"),
                               Mesh{1, 1, 1, 2, 0}, 1000);
  expect_rel(e.allreduce_bytes, 512000);
  expect_rel(e.phases.tp_allreduce, 4 * (128e-6 + 4 * 3e-6));
  // moe_rows below gemm_rows is gemm_rows (a call is at least a block): 10 calls.
  const Prediction b = predict(tiny_moe(), engine_profile(R"({"gemm_rows": 100, "moe_rows": 50})"),
                               Mesh{1, 1, 1, 2, 0}, 1000);
  expect_rel(b.phases.tp_allreduce, 4 * (128e-6 + 10 * 3e-6));
  // Fewer calls read the experts' weights fewer times: the linear phase does not grow.
  const Prediction one = predict(tiny_moe(), engine_profile(R"({"gemm_rows": 100})"), Mesh{}, 1000);
  const Prediction calls = predict(tiny_moe(), engine_profile(R"({"gemm_rows": 100, "moe_rows": 1000})"), Mesh{}, 1000);
  EXPECT_LE(calls.phases.linear, one.phases.linear);
}

TEST(EngineSpec, UnfusedElementwiseBytes) {
  // tiny_moe (h 64, 4 heads and 2 KV heads of 16, 8 experts of 32, top-2), one rank, bf16:
  // per token and layer 8h + 8·(4+4)·16 + 8·(4+2)·16 + 6·(h + 64) + 4h + 8h = 512 + 1024 + 768
  // + 768 + 256 + 512 = 3,840; MoE 6·(64 + 128 + 64) + 8·2·64 + 12·2·32 + 12·2·64 = 1,536 +
  // 1,024 + 768 + 1,536 = 4,864; total 8,704 B · 1000 tokens · 2 layers / 1 TB/s = 17.408 us.
  const Prediction p = predict(tiny_moe(), engine_profile(R"({"unfused_elementwise": true})"), Mesh{}, 1000);
  expect_rel(p.phases.elementwise, 8704.0 * 1000 * 2 / 1e12);
  EXPECT_EQ(elementwise_bytes_per_token(tiny_moe(), 1, "bf16", true), 8704);
  // fp32 GEMMs convert nothing: 8,704 - 768 - 1,536 = 6,400.
  EXPECT_EQ(elementwise_bytes_per_token(tiny_moe(), 1, "fp32", true), 6400);
  // A measured element-wise rate of 10 GB/s replaces the memory bandwidth: 1.7408 ms.
  const Prediction measured =
      predict(tiny_moe(), engine_profile(R"({"unfused_elementwise": true, "elementwise_gbs": 10})"), Mesh{}, 1000);
  expect_rel(measured.phases.elementwise, 8704.0 * 1000 * 2 / 1e10);
}

TEST(EngineSpec, TileWorkFromTheCalibratedPoint) {
  // With tiles and a calibration point, the profile's rate is what a causal self-attention of
  // that length achieved in exact pairs: predicting exactly that call gives the time the
  // calibration measured. tiny_dense's full layer at n = 512 tokens, one rank:
  // 256 FLOP x 131,328 pairs at 0.5 TFLOP/s = 67.24 us, whatever the tiles and overhead.
  const HardwareProfile p = engine_profile(R"({"attention_block_q": 64, "attention_block_k": 64,
      "attention_row_overhead": 56, "attention_calibrated_tokens": 512})");
  model::ModelConfig c = tiny_dense();
  c.layer_window = {0};
  c.num_layers = 1;
  expect_rel(predict(c, p, Mesh{}, 512).phases.attention, 256.0 * 131328 / 5e11);
  // Shorter calls do more tile and row overhead per pair: slower per pair than the rate.
  const Prediction shorter = predict(c, p, Mesh{}, 128);
  EXPECT_GT(shorter.phases.attention, 256.0 * attention_pairs(0, 128, 0) / 5e11 * 1.05);
  // A ring of 2 and Ulysses 2 never predict more attention per rank than one rank.
  const double one = predict(c, p, Mesh{}, 4096).phases.attention;
  EXPECT_LT(predict(c, p, Mesh{1, 2, 1, 1, 0}, 4096).phases.attention, one);
  EXPECT_LT(predict(c, p, Mesh{1, 1, 2, 1, 0}, 4096).phases.attention, one);
}

TEST(EngineSpec, ZeroFilledBuffers) {
  // tiny_dense, one rank, 1000 tokens: K/V cache 1000 · 2 · 16 · 4 = 128,000 B per tensor, a K
  // and a V for each of 2 layers; q and attention-output buffers 1000 · 4 · 16 · 4 = 256,000 B
  // each. First touch at 1 GB/s: (4 · 128,000 + 2 · 256,000) B = 1,024 us; each layer clears
  // its attention output at the memory bandwidth (1 TB/s): 2 · 0.256 us.
  const Prediction p = predict(tiny_dense(), engine_profile(R"({"zero_fill_gbs": 1})"), Mesh{}, 1000);
  expect_rel(p.phases.overhead, 1024e-6 + 0.512e-6);
  // Ring 2: each rank holds half the rows, so half of everything.
  const Prediction r2 = predict(tiny_dense(), engine_profile(R"({"zero_fill_gbs": 1})"), Mesh{1, 2, 1, 1, 0}, 1000);
  expect_rel(r2.phases.overhead, (1024e-6 + 0.512e-6) / 2);
  EXPECT_EQ(predict(tiny_dense(), engine_profile("{}"), Mesh{}, 1000).phases.overhead, 0);
}

TEST(EngineSpec, AttentionCurveOverContextLength) {
  // Curve points in exact pairs of a causal self-attention with 2 KV heads: 500 GFLOP/s at 512
  // tokens, 250 at 2048. A one-rank prediction at a curve point takes exactly the time the
  // curve says; between points the rate lies between; past the ends it is clamped.
  const HardwareProfile p = engine_profile(R"({"attention_block_q": 64, "attention_block_k": 64,
      "attention_row_overhead": 10, "attention_curve_kv_heads": 2,
      "attention_curve": [{"tokens": 512, "gflops": 500}, {"tokens": 2048, "gflops": 250}]})");
  ASSERT_EQ(p.engine.attention_curve.size(), 2u);
  model::ModelConfig c = tiny_dense();
  c.layer_window = {0};
  c.num_layers = 1;
  auto per_pair = [&](const Mesh& m, int64_t n) {
    return predict(c, p, m, n).phases.attention / (256.0 * attention_pairs(0, n, 0));
  };
  expect_rel(per_pair(Mesh{}, 512), 1 / 5e11);
  expect_rel(per_pair(Mesh{}, 2048), 1 / 2.5e11);
  EXPECT_GT(per_pair(Mesh{}, 1024), 1 / 5e11);
  EXPECT_LT(per_pair(Mesh{}, 1024), 1 / 2.5e11 * 1.01);
  // Past the last point: the last point's per-tile rate (tile overhead shrinks a little more).
  EXPECT_LT(per_pair(Mesh{}, 8192), 1 / 2.5e11);
  EXPECT_GT(per_pair(Mesh{}, 8192), 0.95 / 2.5e11);
  // Ulysses 2 keeps one of the 2 KV heads and half the query heads, over the same 2048 keys:
  // half the work at the same rate. A ring of 2 streams blocks of 1024 keys: faster per pair.
  const double u2 = predict(c, p, Mesh{1, 1, 2, 1, 0}, 2048).phases.attention;
  const double one = predict(c, p, Mesh{}, 2048).phases.attention;
  expect_rel(u2, one / 2);
  EXPECT_LT(predict(c, p, Mesh{1, 2, 1, 1, 0}, 2048).phases.attention, one / 2);
  // Errors name the field.
  try {
    engine_profile(R"({"attention_block_q": 64, "attention_block_k": 64, "attention_curve_kv_heads": 2,
        "attention_curve": [{"tokens": 512, "gflops": 1}], "attention_curve_query_rows": -1})");
    ADD_FAILURE() << "negative query rows were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engine.attention_curve_query_rows"), std::string::npos) << e.what();
  }
  try {
    engine_profile(R"({"attention_block_q": 64, "attention_block_k": 64, "attention_curve_kv_heads": 2,
        "attention_curve": [{"tokens": 2048, "gflops": 1}, {"tokens": 512, "gflops": 1}]})");
    ADD_FAILURE() << "a decreasing curve was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engine.attention_curve[1].tokens"), std::string::npos) << e.what();
  }
}

TEST(EngineSpec, AttentionCurveOfChunkCalls) {
  // slope calibrate measures each curve point as one chunk's call: the last R queries against
  // all n keys. A point of 2048 keys measured with R = 512 at 250 GFLOP/s (exact pairs), tiles
  // 64 x 64, no row overhead. That call's tile work, by hand: blocks of 64 rows starting at
  // 1536 + 64i each visit 1600 + 64i keys, 64 · Σ_{i<8} (1600 + 64i) = 933,888, against
  // Σ_{q=1536}^{2047} (q + 1) = 917,760 pairs. The one-rank prediction of a whole causal 2048
  // (tile work 4096 · Σ_{i<32} (i + 1) = 2,162,688; pairs 2048 · 2049 / 2 = 2,098,176) runs at
  // the same per-tile rate.
  model::ModelConfig c = tiny_dense();
  c.layer_window = {0};
  c.num_layers = 1;
  auto per_pair = [&](const std::string& rows) {
    const HardwareProfile p = engine_profile(R"({"attention_block_q": 64, "attention_block_k": 64,
        "attention_curve_kv_heads": 2, "attention_curve": [{"tokens": 2048, "gflops": 250}])" + rows + "}");
    return predict(c, p, Mesh{}, 2048).phases.attention / (256.0 * attention_pairs(0, 2048, 0));
  };
  const double chunk_ratio = 933888.0 / 917760.0, full_ratio = 2162688.0 / 2098176.0;
  expect_rel(per_pair(R"(, "attention_curve_query_rows": 512)"), full_ratio / chunk_ratio / 2.5e11);
  // Without the field (or 0, or R >= n) the point is the whole causal call, read as before.
  expect_rel(per_pair(""), 1 / 2.5e11);
  expect_rel(per_pair(R"(, "attention_curve_query_rows": 0)"), 1 / 2.5e11);
  expect_rel(per_pair(R"(, "attention_curve_query_rows": 4096)"), 1 / 2.5e11);
}

}  // namespace
}  // namespace slope::planner
