// Random-model generator: tiny models of every architecture are written, read back through
// load_config and WeightStore, and checked tensor by tensor against the HF names and shapes
// written out by hand here (not taken from the generator's own list).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/model/config.h"
#include "slope/model/make_model.h"
#include "slope/model/safetensors.h"
#include "../error_of.h"

using namespace slope;
using namespace slope::model;
namespace fs = std::filesystem;

namespace {

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& ch : name) if (ch == '/') ch = '_';
    dir_ = fs::temp_directory_path() / ("slope_mm_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string sub(const std::string& s) const { return (dir_ / s).string(); }
  fs::path dir_;
};

using slope::testing::error_of;

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tiny preset's dimensions: vocab 512, hidden 64, heads 4 (kv 2) of 16, intermediate 64;
// 2 layers for the dense models, 4 for gpt-oss with 4 experts.
constexpr int64_t V = 512, H = 64, NH = 4, NKV = 2, D = 16, I = 64, E = 4;

std::map<std::string, Shape> expected_dense(const std::string& arch) {
  std::map<std::string, Shape> m{{"model.embed_tokens.weight", {V, H}},
                                 {"model.norm.weight", {H}},
                                 {"lm_head.weight", {V, H}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = {H};
    m[p + "post_attention_layernorm.weight"] = {H};
    m[p + "self_attn.q_proj.weight"] = {NH * D, H};
    m[p + "self_attn.k_proj.weight"] = {NKV * D, H};
    m[p + "self_attn.v_proj.weight"] = {NKV * D, H};
    m[p + "self_attn.o_proj.weight"] = {H, NH * D};
    if (arch == "qwen2") {
      m[p + "self_attn.q_proj.bias"] = {NH * D};
      m[p + "self_attn.k_proj.bias"] = {NKV * D};
      m[p + "self_attn.v_proj.bias"] = {NKV * D};
    }
    if (arch == "qwen3") {
      m[p + "self_attn.q_norm.weight"] = {D};
      m[p + "self_attn.k_norm.weight"] = {D};
    }
    m[p + "mlp.gate_proj.weight"] = {I, H};
    m[p + "mlp.up_proj.weight"] = {I, H};
    m[p + "mlp.down_proj.weight"] = {H, I};
  }
  return m;
}

std::map<std::string, Shape> expected_gpt_oss(bool mxfp4) {
  std::map<std::string, Shape> m{{"model.embed_tokens.weight", {V, H}},
                                 {"model.norm.weight", {H}},
                                 {"lm_head.weight", {V, H}}};
  for (int l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = {H};
    m[p + "post_attention_layernorm.weight"] = {H};
    m[p + "self_attn.q_proj.weight"] = {NH * D, H};
    m[p + "self_attn.q_proj.bias"] = {NH * D};
    m[p + "self_attn.k_proj.weight"] = {NKV * D, H};
    m[p + "self_attn.k_proj.bias"] = {NKV * D};
    m[p + "self_attn.v_proj.weight"] = {NKV * D, H};
    m[p + "self_attn.v_proj.bias"] = {NKV * D};
    m[p + "self_attn.o_proj.weight"] = {H, NH * D};
    m[p + "self_attn.o_proj.bias"] = {H};
    m[p + "self_attn.sinks"] = {NH};
    m[p + "mlp.router.weight"] = {E, H};
    m[p + "mlp.router.bias"] = {E};
    m[p + "mlp.experts.gate_up_proj_bias"] = {E, 2 * I};
    m[p + "mlp.experts.down_proj_bias"] = {E, H};
    if (mxfp4) {
      m[p + "mlp.experts.gate_up_proj_blocks"] = {E, 2 * I, H / 32, 16};
      m[p + "mlp.experts.gate_up_proj_scales"] = {E, 2 * I, H / 32};
      m[p + "mlp.experts.down_proj_blocks"] = {E, H, I / 32, 16};
      m[p + "mlp.experts.down_proj_scales"] = {E, H, I / 32};
    } else {
      m[p + "mlp.experts.gate_up_proj"] = {E, H, 2 * I};
      m[p + "mlp.experts.down_proj"] = {E, I, H};
    }
  }
  return m;
}

struct Case {
  std::string arch;
  bool mxfp4;
};

class MakeModelArch : public MakeModelTest, public ::testing::WithParamInterface<Case> {};

TEST_P(MakeModelArch, TinyLoadsBackWithHfNamesAndShapes) {
  const Case c = GetParam();
  MakeModelOptions o;
  o.arch = c.arch;
  o.preset = "tiny";
  o.seed = 7;
  o.out_dir = dir_.string();
  o.mxfp4 = c.mxfp4;
  make_model(o);

  ModelConfig cfg = load_config(dir_.string());
  EXPECT_EQ(arch_name(cfg.arch), c.arch == "gpt-oss" ? "gpt_oss" : c.arch);
  EXPECT_EQ(cfg.hidden_size, H);
  EXPECT_EQ(cfg.head_dim, D);
  EXPECT_EQ(cfg.torch_dtype, "bfloat16");
  EXPECT_EQ(cfg.mxfp4_experts, c.mxfp4);

  WeightStore ws(dir_.string());
  const auto expected = c.arch == "gpt-oss" ? expected_gpt_oss(c.mxfp4) : expected_dense(c.arch);
  EXPECT_EQ(ws.names().size(), expected.size());
  int64_t params = 0;
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(ws.contains(name)) << "missing " << name;
    Tensor t = ws.get(name, shape);
    const bool u8 = name.find("_blocks") != std::string::npos || name.find("_scales") != std::string::npos;
    EXPECT_EQ(t.dtype(), u8 ? DType::U8 : DType::BF16) << name;
    if (!u8) params += t.numel();
  }
  // Every parameter the config counts is in the file (MXFP4 experts: 2 values per block byte).
  if (c.mxfp4) {
    for (int l = 0; l < 4; ++l)
      params += 2 * (ws.get("model.layers." + std::to_string(l) + ".mlp.experts.gate_up_proj_blocks").numel() +
                     ws.get("model.layers." + std::to_string(l) + ".mlp.experts.down_proj_blocks").numel());
  }
  EXPECT_EQ(params, cfg.num_parameters());

  // Weights look like an initialised model: norms near 1, projections ~N(0, 0.02).
  Tensor norm = ws.get("model.layers.0.input_layernorm.weight").to_f32();
  double mean = 0;
  for (int64_t i = 0; i < norm.numel(); ++i) mean += norm.data<float>()[i];
  EXPECT_NEAR(mean / norm.numel(), 1.0, 0.05);
  Tensor q = ws.get("model.layers.0.self_attn.q_proj.weight").to_f32();
  double ss = 0;
  for (int64_t i = 0; i < q.numel(); ++i) ss += double(q.data<float>()[i]) * q.data<float>()[i];
  EXPECT_NEAR(std::sqrt(ss / q.numel()), 0.02, 0.002);
}

INSTANTIATE_TEST_SUITE_P(Archs, MakeModelArch,
                         ::testing::Values(Case{"gpt-oss", false}, Case{"gpt-oss", true}, Case{"llama", false},
                                           Case{"qwen2", false}, Case{"qwen3", false}),
                         [](const auto& info) { return (info.param.arch == "gpt-oss" ? std::string("gpt_oss") : info.param.arch) +
                                                       (info.param.mxfp4 ? "_mxfp4" : ""); });

TEST_F(MakeModelTest, DeterministicInSeed) {
  auto gen = [&](const std::string& d, uint64_t seed) {
    MakeModelOptions o{"gpt-oss", "tiny", seed, sub(d), DType::BF16, true};
    make_model(o);
    return read_file(sub(d) + "/model.safetensors");
  };
  const std::string a = gen("a", 1), b = gen("b", 1), c = gen("c", 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), c.size());
  EXPECT_EQ(read_file(sub("a") + "/config.json"), read_file(sub("c") + "/config.json"));
}

TEST_F(MakeModelTest, Mxfp4ValuesAreSmall) {
  make_model({"gpt-oss", "tiny", 3, dir_.string(), DType::BF16, true});
  WeightStore ws(dir_.string());
  Tensor blocks = ws.get("model.layers.1.mlp.experts.down_proj_blocks");  // [E, H, I/32, 16]
  Tensor scales = ws.get("model.layers.1.mlp.experts.down_proj_scales");  // [E, H, I/32]
  // Decode by the format's definition (gpt-oss-model.md section 3).
  static const float kFp4[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  double ss = 0;
  const int64_t nblocks = scales.numel();
  for (int64_t b = 0; b < nblocks; ++b) {
    const int s = scales.data<uint8_t>()[b];
    EXPECT_GE(s, 115);
    EXPECT_LE(s, 127);
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = blocks.data<uint8_t>()[b * 16 + j];
      for (int nib : {byte & 0xF, byte >> 4}) {
        const double v = std::ldexp(kFp4[nib], s - 127);
        ss += v * v;
      }
    }
  }
  const double rms = std::sqrt(ss / (nblocks * 32));
  EXPECT_GT(rms, 0.005);
  EXPECT_LT(rms, 0.2);
}

TEST_F(MakeModelTest, OtherDtypes) {
  make_model({"llama", "tiny", 1, sub("f32"), DType::F32, false});
  EXPECT_EQ(load_config(sub("f32")).torch_dtype, "float32");
  EXPECT_EQ(WeightStore(sub("f32")).get("model.norm.weight").dtype(), DType::F32);
  make_model({"qwen3", "tiny", 1, sub("f16"), DType::F16, false});
  EXPECT_EQ(load_config(sub("f16")).torch_dtype, "float16");
  Tensor w = WeightStore(sub("f16")).get("model.layers.1.self_attn.k_norm.weight", {D});
  EXPECT_EQ(w.dtype(), DType::F16);
  Tensor f = w.to_f32();
  for (int64_t i = 0; i < f.numel(); ++i) EXPECT_NEAR(f.data<float>()[i], 1.0f, 0.4f);
}

TEST_F(MakeModelTest, ConfigIsCompleteForTransformers) {
  // Fields transformers' GptOssConfig reads, with the values the tiny preset promises.
  auto j = nlohmann::json::parse(make_model_config_json({"gpt-oss", "tiny", 0, "", DType::BF16, true}));
  EXPECT_EQ(j["architectures"][0], "GptOssForCausalLM");
  EXPECT_EQ(j["model_type"], "gpt_oss");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["attention_bias"], true);
  EXPECT_EQ(j["sliding_window"], 16);
  EXPECT_EQ(j["layer_types"].size(), 4u);
  EXPECT_EQ(j["layer_types"][0], "sliding_attention");
  EXPECT_EQ(j["layer_types"][1], "full_attention");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["truncate"], false);
  EXPECT_EQ(j["rope_scaling"]["factor"], 4.0);
  // transformers 4.5x takes the YaRN factor as max_position_embeddings / original, 5.x the
  // explicit factor: the two agree, so every version computes the same frequencies.
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 1024);
  EXPECT_EQ(j["max_position_embeddings"].get<double>() / 1024, 4.0);
  EXPECT_EQ(j["initial_context_length"], 1024);
  EXPECT_EQ(j["num_local_experts"], 4);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["experts_per_token"], 2);
  EXPECT_EQ(j["output_router_logits"], false);
  EXPECT_TRUE(j.contains("router_aux_loss_coef"));
  EXPECT_EQ(j["swiglu_limit"], 7.0);
  EXPECT_EQ(j["quantization_config"]["quant_method"], "mxfp4");
  EXPECT_EQ(j["quantization_config"]["modules_to_not_convert"].size(), 4u);
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) EXPECT_LT(j[id].get<int64_t>(), 512) << id;

  auto l = nlohmann::json::parse(make_model_config_json({"llama", "tiny", 0, "", DType::F32, false}));
  EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(l["torch_dtype"], "float32");
  EXPECT_EQ(l["mlp_bias"], false);
  auto q = nlohmann::json::parse(make_model_config_json({"qwen2", "tiny", 0, "", DType::BF16, false}));
  EXPECT_EQ(q["use_sliding_window"], false);
  auto plain = nlohmann::json::parse(make_model_config_json({"gpt-oss", "tiny", 0, "", DType::BF16, false}));
  EXPECT_FALSE(plain.contains("quantization_config"));
}

TEST_F(MakeModelTest, BenchPresetsHaveTheAdvertisedShape) {
  // Only the configs: generating ~1 GB does not belong in a unit test.
  ModelConfig g = parse_config(make_model_config_json({"gpt-oss", "bench", 0, "", DType::BF16, false}));
  EXPECT_EQ(g.num_layers, 12);
  EXPECT_EQ(g.hidden_size, 1024);
  EXPECT_EQ(g.num_experts, 8);
  EXPECT_EQ(g.experts_per_token, 4);
  EXPECT_EQ(g.layer_window[0], 128);
  EXPECT_EQ(g.layer_window[1], 0);
  EXPECT_EQ(g.rope.original_max_position_embeddings, 4096);
  const double gb = 2.0 * g.num_parameters() / 1e9;  // bf16 bytes
  EXPECT_GT(gb, 0.5);
  EXPECT_LT(gb, 1.0);
  ModelConfig d = parse_config(make_model_config_json({"qwen3", "bench", 0, "", DType::BF16, false}));
  EXPECT_EQ(d.hidden_size, 2048);
  EXPECT_EQ(d.num_layers, 16);
  EXPECT_NEAR(d.num_parameters() / 1e9, 0.85, 0.1);
}

TEST_F(MakeModelTest, BadOptions) {
  std::string msg = error_of([&] { make_model({"mistral", "tiny", 0, dir_.string()}); });
  EXPECT_HAS(msg, "mistral");
  msg = error_of([&] { make_model({"llama", "huge", 0, dir_.string()}); });
  EXPECT_HAS(msg, "huge");
  msg = error_of([&] { make_model({"llama", "tiny", 0, dir_.string(), DType::BF16, true}); });
  EXPECT_HAS(msg, "mxfp4");
  msg = error_of([&] { make_model({"llama", "tiny", 0, dir_.string(), DType::U8}); });
  EXPECT_HAS(msg, "U8");
  msg = error_of([&] { make_model({"llama", "tiny", 0, ""}); });
  EXPECT_HAS(msg, "output directory");
  EXPECT_FALSE(fs::exists(dir_));
}

}  // namespace

namespace {

// The reference fixtures' checkpoints were written by transformers and the safetensors library
// (tests/reference/make_fixtures.py): reading them checks the reader against the reference
// writer, and the tensor list checks model_tensor_specs against the layout transformers uses.
TEST(HfCheckpoints, FixtureModelsMatchTensorSpecs) {
  const std::pair<const char*, DType> families[] = {{"gpt_oss", DType::BF16},
                                                    {"gpt_oss_mxfp4", DType::BF16},
                                                    {"llama", DType::F32},
                                                    {"qwen2", DType::F16},
                                                    {"qwen3", DType::BF16}};
  for (const auto& [family, dtype] : families) {
    const std::string dir = std::string(SLOPE_REFERENCE_DIR) + "/fixtures/" + family + "/model";
    if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "no fixtures at " << dir;
    SCOPED_TRACE(family);
    ModelConfig cfg = load_config(dir);
    EXPECT_EQ(cfg.mxfp4_experts, std::string(family) == "gpt_oss_mxfp4");
    WeightStore ws(dir);
    const auto specs = model_tensor_specs(cfg, dtype);
    EXPECT_EQ(ws.names().size(), specs.size());
    for (const TensorSpec& s : specs) {
      ASSERT_TRUE(ws.contains(s.name)) << s.name;
      Tensor t = ws.get(s.name, s.shape);
      EXPECT_EQ(t.dtype(), s.dtype) << s.name;
    }
  }
}

}  // namespace
