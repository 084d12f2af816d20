// `slope calibrate --model` end to end: the profile it writes carries the engine object
// measured at the model's shapes, loads as a hardware profile, and `slope plan --predict`
// uses it; bad input exits non-zero with a message that says what to fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../run_slope.h"
#include "slope/planner/hardware_profile.h"

namespace {

using slope::testing::run_slope;

TEST(CliCalibrate, EngineObjectAtTheModelsShapes) {
  const auto out = std::filesystem::temp_directory_path() / ("slope_calibrate_" + std::to_string(getpid()) + ".json");
  const std::string model = "tests/reference/fixtures/gpt_oss/model";
  auto r = run_slope("calibrate --out " + out.string() + " --threads 1 --reps 1 --model " + model +
                 " --block-rows 64 --moe-rows 96 --attention-max-tokens 2048 --fp32-peak-per-thread 1000 --bf16-peak-per-thread 2000");
  ASSERT_EQ(r.code, 0) << r.out;
  const slope::planner::HardwareProfile p = slope::planner::load_profile(out.string());
  const slope::planner::EngineSpec& e = p.engine;
  ASSERT_TRUE(e.present);
  EXPECT_GT(e.elementwise_gbs, 0);
  EXPECT_GT(e.zero_fill_gbs, 0);
  EXPECT_EQ(e.gemm_rows, 64);
  EXPECT_EQ(e.moe_rows, 96);
  EXPECT_EQ(e.attention_block_q, 64);
  // Curve points at 1024 and 2048 tokens with the fixture's KV heads.
  ASSERT_EQ(e.attention_curve.size(), 2u);
  EXPECT_EQ(e.attention_curve[0].first, 1024);
  EXPECT_EQ(e.attention_curve[1].first, 2048);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(std::string(SLOPE_REFERENCE_DIR) + "/fixtures/gpt_oss/model/config.json"));
  EXPECT_EQ(e.attention_curve_kv_heads, cfg["num_key_value_heads"].get<int64_t>());
  // Each point is one block's call (--block-rows 64) at that many keys.
  EXPECT_EQ(e.attention_curve_query_rows, 64);
  // The matmul rate is the layer's GEMMs, a fraction of the stated peak.
  const double eff = p.device.matmul.at("bf16").efficiency;
  EXPECT_GT(eff, 0);
  EXPECT_LE(eff, 1);
  auto pr = run_slope("plan --predict --model " + model + " --hardware " + out.string() + " --mesh 1,1,1,1 --context 4096");
  EXPECT_EQ(pr.code, 0) << pr.out;
  EXPECT_NE(pr.out.find("elementwise"), std::string::npos) << pr.out;
  std::filesystem::remove(out);
}

TEST(CliCalibrate, BadInputSaysWhatToFix) {
  const std::string out = "--out " + (std::filesystem::temp_directory_path() / "slope_calibrate_bad.json").string();
  struct Case { std::string args, message; };
  const Case cases[] = {
      {"calibrate " + out + " --model configs/none", "cannot read configs/none"},
      {"calibrate " + out + " --model configs/gpt-oss-20b --dtype fp16", "--dtype must be f32 or bf16"},
      {"calibrate " + out + " --model configs/gpt-oss-20b --block-rows 0", "--block-rows must be at least 1"},
      {"calibrate " + out + " --model configs/gpt-oss-20b --moe-rows 0", "--moe-rows must be at least 1"},
      {"calibrate " + out + " --model configs/gpt-oss-20b --attention-max-tokens 100", "--attention-max-tokens must be at least 1024"},
      {"calibrate " + out + " --model configs/gpt-oss-20b", "needs the weights, not only config.json"},
  };
  for (const Case& c : cases) {
    auto r = run_slope(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
