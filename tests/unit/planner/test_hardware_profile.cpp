// Profiles: every shipped profile parses and cites sources; malformed ones fail with a message
// that names the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/hardware_profile.h"

namespace slope::planner {
namespace {

std::string error_of(const std::string& json) {
  try {
    parse_profile(json, "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(HardwareProfile, ShippedProfilesParseAndCiteSources) {
  namespace fs = std::filesystem;
  const std::string dir = testing::source_root() + "/profiles";
  int n = 0;
  for (const char* name : {"mi250-gcd", "mi250-gcd-hdr200x1", "mi300x", "a100-80gb", "h100-sxm", "h200"}) {
    HardwareProfile p = load_profile(dir + "/" + name + ".json");
    EXPECT_EQ(p.name, name);
    EXPECT_EQ(p.node.devices_per_node, 8) << name;
    EXPECT_GE(p.sources.size(), 4u) << name;
    EXPECT_FALSE(p.assumptions.empty()) << name << ": efficiencies are assumptions and must say so";
    EXPECT_GT(p.matmul("bf16").flops_per_s(), 0);
    EXPECT_GT(p.matmul("mxfp4").flops_per_s(), 0);
    EXPECT_LE(p.matmul("bf16").efficiency, 1.0);
    EXPECT_GT(p.attention("bf16").flops_per_s(), 0);
    ++n;
  }
  // This machine's profiles (slope calibrate plus the engine object, docs/planner.md section 6).
  for (const char* name : {"cpu-zen4-1c", "cpu-zen4-2c", "cpu-zen4-2x1", "cpu-zen4-4x1-oversub"}) {
    HardwareProfile p = load_profile(dir + "/" + name + ".json");
    EXPECT_EQ(p.name, name);
    EXPECT_GE(p.sources.size(), 4u) << name;
    EXPECT_FALSE(p.assumptions.empty()) << name;
    EXPECT_TRUE(p.engine.present) << name;
    // Calibrated with the engine's bf16 attention kernel (this Zen 4 has AVX512-BF16), each
    // curve point one chunk's call of the engine's 1024 rows.
    EXPECT_EQ(p.engine.attention_dtype, "bf16") << name << ": SLOPE's CPU attention runs in bf16 in bf16 mode";
    EXPECT_EQ(p.engine.attention_curve_query_rows, 1024) << name;
    EXPECT_EQ(p.engine.wire_bytes, 4) << name;
    EXPECT_GT(p.matmul("bf16").flops_per_s(), p.attention("fp32").flops_per_s()) << name;
    EXPECT_LE(p.matmul("bf16").efficiency, 1.0);
    ++n;
  }
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".json";
  EXPECT_EQ(files, n) << "a profile in profiles/ is not covered by this test";
}

TEST(HardwareProfile, DatasheetNumbers) {
  const std::string dir = testing::source_root() + "/profiles/";
  HardwareProfile mi = load_profile(dir + "mi250-gcd.json");
  EXPECT_DOUBLE_EQ(mi.matmul("bf16").peak_tflops, 181.0);  // 362.1 TF per OAM / 2
  EXPECT_DOUBLE_EQ(mi.device.memory_gb, 64);
  EXPECT_DOUBLE_EQ(mi.device.memory_bandwidth_gbs, 1600);
  EXPECT_DOUBLE_EQ(mi.network.bandwidth_gbs_per_device, 23.8);  // osu_bw, one pair
  HardwareProfile h = load_profile(dir + "h100-sxm.json");
  EXPECT_DOUBLE_EQ(h.matmul("bf16").peak_tflops, 989.0);
  EXPECT_DOUBLE_EQ(h.device.memory_bandwidth_gbs, 3350);
}

TEST(HardwareProfile, ErrorsNameTheField) {
  const std::string good = testing::round_profile_json();
  EXPECT_EQ(error_of(good), "");
  EXPECT_NE(error_of("{ not json").find("not valid JSON"), std::string::npos);
  // A number beyond double's range is nlohmann's out_of_range, not a parse_error (found by
  // fuzz_profile): it once escaped as "internal error".
  EXPECT_NE(error_of(replace(good, "\"memory_bandwidth_gbs\": 1000", "\"memory_bandwidth_gbs\": 1e999")).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of(replace(good, "slope-hardware-profile/1", "v0")).find("schema"), std::string::npos);
  EXPECT_NE(error_of(replace(good, "\"memory_gb\": ", "\"memory_gib\": ")).find("device.memory_gb"),
            std::string::npos);
  EXPECT_NE(error_of(replace(good, "\"efficiency\": 0.5", "\"efficiency\": 1.5")).find("device.matmul.bf16.efficiency"),
            std::string::npos);
  EXPECT_NE(error_of(replace(good, "\"peak_tflops\": 2.0", "\"peak_tflops\": \"fast\"")).find("must be a number"),
            std::string::npos);
  EXPECT_NE(error_of(replace(good, "\"devices_per_node\": 8", "\"devices_per_node\": 0")).find("devices_per_node"),
            std::string::npos);
  EXPECT_NE(error_of(replace(good, "\"alltoall\"", "\"all_to_all\"")).find("node.alltoall"), std::string::npos);
  auto no_sources = replace(good, R"([{"what": "everything", "value": "round numbers", "source": "this test"}])", "[]");
  EXPECT_NE(error_of(no_sources).find("sources"), std::string::npos);
  EXPECT_THROW(load_profile("/nonexistent/profile.json"), Error);
  EXPECT_THROW(testing::round_profile().matmul("fp8"), Error);
}

TEST(HardwareProfile, EfficiencyScale) {
  HardwareProfile p = scale_efficiency(testing::round_profile(), 0.5);
  EXPECT_DOUBLE_EQ(p.matmul("bf16").efficiency, 0.25);
  EXPECT_DOUBLE_EQ(p.attention("bf16").efficiency, 0.5);
  EXPECT_DOUBLE_EQ(scale_efficiency(testing::round_profile(), 4).attention("bf16").efficiency, 1.0);
  EXPECT_THROW(scale_efficiency(testing::round_profile(), 0), Error);
}

}  // namespace
}  // namespace slope::planner
