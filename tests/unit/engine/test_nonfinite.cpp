// A non-finite result is never returned (issue 15, defect 3): a tiny llama model with one NaN
// or Inf weight makes the prefill throw slope::Error naming the first layer (or the embedding,
// or the logits) where non-finite values appeared, and Model::load with check_weights names
// the tensor. transformers gives all-NaN logits for a NaN in q_proj; the attention kernel once
// turned the NaN scores into weights of 0 and returned finite logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "../corrupt_model.h"
#include "slope/core/error.h"
#include "slope/core/finite.h"
#include "slope/engine/prefill.h"
#include "slope/model/model.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

const fs::path kLlama = fs::path(SLOPE_REFERENCE_DIR) / "fixtures/llama/model";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
const std::vector<int32_t> kPrompt = {1, 3, 200, 17, 5, 99, 3, 42, 7, 300, 11};

// The message of the slope::Error a prefill of kPrompt on `dir` throws ("" if it returns).
std::string prefill_error(const fs::path& dir, int64_t chunk = 1024) {
  auto m = model::Model::load(dir.string());
  ops::LocalAttention local;
  engine::PrefillOptions po;
  po.chunk_tokens = chunk;
  try {
    engine::PrefillResult r =
        engine::prefill(*m, kPrompt, ops::SequenceShard::whole(int64_t(kPrompt.size())), local, po);
    EXPECT_TRUE(all_finite(r.logits.data(), int64_t(r.logits.size())));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NonFinite, CleanModelPasses) { EXPECT_EQ(prefill_error(kLlama), ""); }

TEST(NonFinite, NanInQProjNamesLayer0) {
  const fs::path d = slope::testing::corrupt_model_copy(kLlama, "qproj", "model.layers.0.self_attn.q_proj.weight", kNaN, 70);
  for (int64_t chunk : {1024, 4}) {
    const std::string e = prefill_error(d, chunk);
    EXPECT_NE(e.find("first in layer 0 "), std::string::npos) << e;
    EXPECT_NE(e.find("--check-weights"), std::string::npos) << e;
  }
  fs::remove_all(d);
}

TEST(NonFinite, InfElsewhereNamesItsPlace) {
  struct Case {
    std::string tensor;
    float value;
    int64_t element;
    std::string place;
  };
  const Case cases[] = {
      {"model.layers.1.mlp.down_proj.weight", kInf, 300, "first in layer 1 "},
      {"model.layers.1.self_attn.v_proj.weight", -kInf, 5, "first in layer 1 "},
      {"model.layers.0.post_attention_layernorm.weight", kNaN, 9, "first in layer 0 "},
      {"model.embed_tokens.weight", kInf, 200 * 64 + 3, "first in the embedding"},  // token 200's row
      {"lm_head.weight", kNaN, 100 * 64 + 1, "non-finite logits"},
      {"model.norm.weight", kInf, 2, "non-finite logits"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const fs::path d = slope::testing::corrupt_model_copy(kLlama, "case" + std::to_string(i++), c.tensor, c.value, c.element);
    const std::string e = prefill_error(d);
    EXPECT_NE(e.find(c.place), std::string::npos) << c.tensor << ": " << e;
    fs::remove_all(d);
  }
}

TEST(NonFinite, CheckWeightsNamesTheTensor) {
  const fs::path d = slope::testing::corrupt_model_copy(kLlama, "check", "model.layers.1.mlp.up_proj.weight", kNaN, 77);
  model::LoadOptions lo;
  lo.check_weights = true;
  try {
    model::Model::load(d.string(), lo);
    ADD_FAILURE() << "load with check_weights accepted a NaN weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor model.layers.1.mlp.up_proj.weight [128, 64] holds a non-finite value "
                                         "(NaN or Inf) at element 77"),
              std::string::npos)
        << e.what();
  }
  // Layers this rank does not load are not read.
  lo.last_layer = 1;
  EXPECT_NO_THROW(model::Model::load(d.string(), lo));
  lo = {};
  lo.check_weights = true;
  EXPECT_NO_THROW(model::Model::load(kLlama.string(), lo));
  fs::remove_all(d);
}

// An MXFP4 scale of 255 (e8m0's NaN; it dequantises to Inf) is reported by check_weights.
TEST(NonFinite, Mxfp4ScaleOf255) {
  const fs::path gpt = fs::path(SLOPE_REFERENCE_DIR) / "fixtures/gpt_oss_mxfp4/model";
  const fs::path d = slope::testing::corrupt_model_copy(gpt, "mxfp4", "model.layers.1.mlp.experts.down_proj_scales", kNaN, 0);
  model::LoadOptions lo;
  lo.check_weights = true;
  try {
    model::Model::load(d.string(), lo);
    ADD_FAILURE() << "load with check_weights accepted a scale of 255";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.experts.down_proj_scales [4, 64, 2] holds an MXFP4 scale"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(d);
}

TEST(NonFinite, FirstNonfiniteFindsEveryDtype) {
  std::vector<float> x(10000, 1.0f);
  EXPECT_EQ(first_nonfinite(x.data(), int64_t(x.size())), -1);
  x[9999] = -kInf;
  x[5000] = kNaN;
  EXPECT_EQ(first_nonfinite(x.data(), int64_t(x.size())), 5000);
  EXPECT_FALSE(all_finite(x.data(), int64_t(x.size())));
  x[5000] = std::numeric_limits<float>::max();  // large but finite
  EXPECT_EQ(first_nonfinite(x.data(), int64_t(x.size())), 9999);
  Tensor b({3000}, DType::BF16), h({3000}, DType::F16);
  EXPECT_EQ(first_nonfinite(b), -1);
  b.data<uint16_t>()[2999] = 0xff80;  // bf16 -inf
  EXPECT_EQ(first_nonfinite(b), 2999);
  h.data<uint16_t>()[17] = 0x7bff;  // f16 max, finite
  EXPECT_EQ(first_nonfinite(h), -1);
  h.data<uint16_t>()[18] = 0x7e00;  // f16 NaN
  EXPECT_EQ(first_nonfinite(h), 18);
}

}  // namespace
