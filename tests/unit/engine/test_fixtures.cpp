// Whole models against Hugging Face transformers: tests/reference/make_fixtures.py recorded,
// for tiny random models of every supported family, the last-position logits and every layer's
// K (after RoPE) and V for fixed prompts. The engine must reproduce them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>

#include "slope/engine/distributed.h"
#include "slope/engine/prefill.h"
#include "slope/kernels/gemm.h"
#include "slope/model/model.h"
#include "slope/model/safetensors.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

// Relative error, norm-wise: max|a - b| / max|b|.
constexpr double kF32Tol = 1e-4;  // f32 compute vs transformers float32
constexpr double kBf16Tol = 5e-2; // bf16 weights/activations, f32 accumulation

double rel_err(const float* a, const float* b, int64_t n) { return engine::relative_error(a, b, n); }

struct Case {
  std::string family;
  std::string file;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.file; }

std::vector<Case> cases() {
  std::vector<Case> out;
  const fs::path root = fs::path(SLOPE_REFERENCE_DIR) / "fixtures";
  if (!fs::exists(root)) return out;
  for (const auto& fam : fs::directory_iterator(root)) {
    if (!fam.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(fam.path()))
      if (f.path().filename().string().rfind("len_", 0) == 0)
        out.push_back({fam.path().filename().string(), f.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.file < b.file; });
  return out;
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string s = info.param.family + "_" + fs::path(info.param.file).stem().string();
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// One model per (family, compute type, bf16 units now set), loaded once.
const model::Model& load(const std::string& family, kernels::ComputeType ct) {
  static std::map<std::tuple<std::string, int, int>, std::unique_ptr<model::Model>> cache;
  auto& m = cache[{family, int(ct), int(kernels::bf16_units())}];
  if (!m) {
    model::LoadOptions lo;
    lo.compute = ct;
    m = model::Model::load((fs::path(SLOPE_REFERENCE_DIR) / "fixtures" / family / "model").string(), lo);
  }
  return *m;
}

class FixtureTest : public testing::TestWithParam<Case> {
 protected:
  void check(kernels::ComputeType ct, double tol, bool check_kv, int64_t chunk,
             int64_t moe_chunk = model::kDefaultMoeChunk) {
    const model::Model& m = load(GetParam().family, ct);
    model::SafetensorsFile ref(GetParam().file);
    Tensor tok = ref.get("tokens");
    std::vector<int32_t> tokens(tok.numel());
    for (int64_t i = 0; i < tok.numel(); ++i) tokens[i] = int32_t(tok.data<int64_t>()[i]);
    ops::LocalAttention runner;
    engine::PrefillOptions po;
    po.chunk_tokens = chunk;
    po.moe_chunk_tokens = moe_chunk;
    engine::PrefillResult r =
        engine::prefill(m, tokens, ops::SequenceShard::whole(int64_t(tokens.size())), runner, po);
    ASSERT_TRUE(r.has_logits);
    Tensor logits = ref.get("logits");
    ASSERT_EQ(logits.numel(), int64_t(r.logits.size()));
    const float* want = logits.data<float>();
    EXPECT_LE(rel_err(r.logits.data(), want, logits.numel()), tol);
    const int64_t ref_argmax = std::max_element(want, want + logits.numel()) - want;
    EXPECT_EQ(r.first_token, ref_argmax);
    if (!check_kv) return;
    for (int64_t l = 0; l < m.config().num_layers; ++l) {
      for (const char* kv : {"k", "v"}) {
        Tensor want_kv = ref.get("layers." + std::to_string(l) + "." + kv);
        const Tensor& got = kv[0] == 'k' ? r.k[l] : r.v[l];
        ASSERT_EQ(got.shape(), want_kv.shape()) << "layer " << l << " " << kv;
        EXPECT_LE(rel_err(got.data<float>(), want_kv.data<float>(), got.numel()), tol)
            << "layer " << l << " " << kv;
      }
    }
  }
};

TEST_P(FixtureTest, F32MatchesTransformers) { check(kernels::ComputeType::F32, kF32Tol, true, 1024); }

// Small chunks: the token-local work split into pieces must not change anything.
TEST_P(FixtureTest, F32SmallChunksMatchTransformers) { check(kernels::ComputeType::F32, kF32Tol, true, 5); }

// MoE calls of their own size (LayerContext::moe_chunk) apart from the chunk: smaller than the
// prompt and not a multiple of the chunk, and no larger than the chunk (calls of chunk rows).
TEST_P(FixtureTest, F32MoeCallsApartFromChunksMatchTransformers) {
  check(kernels::ComputeType::F32, kF32Tol, true, 5, 7);
  check(kernels::ComputeType::F32, kF32Tol, true, 6, 1);
}

// On each units bf16 mode can run on here (kernels/bf16_units.h), whichever it would choose.
TEST_P(FixtureTest, Bf16WithinBound) {
  std::vector<kernels::Bf16Units> units{kernels::Bf16Units::F32};
  if (kernels::native_bf16_matmul_supported()) units.push_back(kernels::Bf16Units::Bf16);
  for (kernels::Bf16Units u : units) {
    SCOPED_TRACE(std::string("bf16 units: ") + kernels::bf16_units_name(u));
    kernels::set_bf16_units(u);
    check(kernels::ComputeType::BF16, kBf16Tol, false, 1024);
    check(kernels::ComputeType::BF16, kBf16Tol, false, 5, 7);  // the bf16 experts in several calls
    kernels::set_bf16_units(kernels::Bf16Units::Auto);
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, FixtureTest, testing::ValuesIn(cases()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FixtureTest);

TEST(Fixtures, AllFamiliesPresent) {
  std::map<std::string, int> per_family;
  for (const Case& c : cases()) per_family[c.family]++;
  for (const char* fam : {"gpt_oss", "gpt_oss_mxfp4", "llama", "qwen2", "qwen3"})
    EXPECT_GE(per_family[fam], 3) << "missing fixtures for " << fam;
}

}  // namespace
