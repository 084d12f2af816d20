// The planner's string inputs (--context, --mesh): values, and a slope::Error for everything
// else, including sizes whose arithmetic would overflow. predict() itself refuses lengths and
// chunk counts outside what it models, and runs at the largest accepted length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "planner_fixtures.h"
#include "slope/core/error.h"
#include "slope/planner/parse.h"
#include "../error_of.h"

namespace slope::planner {
namespace {

using slope::testing::error_of;

TEST(ParseContexts, Values) {
  EXPECT_EQ(parse_contexts("32k, 1M,100000 ,7"), (std::vector<int64_t>{32768, 1 << 20, 100000, 7}));
  EXPECT_EQ(parse_contexts("2048m"), (std::vector<int64_t>{kMaxContextTokens}));
  EXPECT_EQ(parse_contexts("2097152k"), (std::vector<int64_t>{kMaxContextTokens}));
  EXPECT_EQ(parse_contexts("2147483648"), (std::vector<int64_t>{kMaxContextTokens}));
  EXPECT_EQ(parse_contexts("+5"), (std::vector<int64_t>{5}));
}

TEST(ParseContexts, Errors) {
  for (const char* bad : {"", ",", "32k,,64k", "0", "-5", "0k", "abc", "12x", "k", "1.5k", "0x10", "5-5"})
    EXPECT_NE(error_of([&] { parse_contexts(bad); }).find("--context"), std::string::npos) << "'" << bad << "'";
  // Too long: each named, with the limit, and no overflow on the way (UBSan builds check that).
  for (const char* big : {"2147483649", "2049m", "2097153k", "9223372036854775807", "9223372036854775808",
                          "9000000000000000k", "18446744073709551617m", "99999999999999999999999999999999"}) {
    const std::string e = error_of([&] { parse_contexts(big); });
    EXPECT_NE(e.find("2048m"), std::string::npos) << big << ": " << e;
    EXPECT_NE(e.find(big), std::string::npos) << big << ": " << e;
  }
}

TEST(ParseMesh, Values) {
  const Mesh m = parse_mesh("2,4,1,8", 4096);
  EXPECT_EQ(m.ulysses, 2);
  EXPECT_EQ(m.ring, 4);
  EXPECT_EQ(m.pp, 1);
  EXPECT_EQ(m.tp, 8);
  EXPECT_EQ(m.pp_chunk, 0);
  EXPECT_EQ(parse_mesh("1,1,2,1", 4096).pp_chunk, 512);  // the engine's default, max(256, N/(4P))
  EXPECT_EQ(parse_mesh("1,1,2,1,-1", 4096).pp_chunk, 512);
  EXPECT_EQ(parse_mesh("1,1,2,1,0", 4096).pp_chunk, 0);
  EXPECT_EQ(parse_mesh("1, 1, 2, 1, 2048", 4096).pp_chunk, 2048);
  EXPECT_EQ(parse_mesh("16,16,16,16", 1).size(), kMaxMeshRanks);
  // A chunk beyond any prompt is one chunk of the whole prompt; the value saturates, never wraps.
  EXPECT_GT(parse_mesh("1,1,2,1,99999999999999999999999", 1).pp_chunk, kMaxContextTokens);
}

TEST(ParseMesh, Errors) {
  for (const char* bad : {"", "1,2", "1,2,1,1,1,1", "a,1,1,1", "1,1,1,1x", "1.5,1,1,1", "0,1,1,1", "1,-1,1,1",
                          "1,1,1,1,-2", "4097,1,1,1", "1,99999999999999999999,1,1", "32,16,16,16"}) {
    const std::string e = error_of([&] { parse_mesh(bad, 4096); });
    EXPECT_NE(e.find("--mesh"), std::string::npos) << "'" << bad << "': " << e;
  }
}

TEST(PredictLimits, RefusesWhatItDoesNotModel) {
  const model::ModelConfig cfg = testing::gpt_oss_120b();
  const HardwareProfile hw = testing::round_profile();
  Mesh m;
  m.ring = 8;
  // INT64_MAX tokens used to overflow the chunk count to 0 and read before the flow shop's
  // vector (SIGSEGV).
  for (int64_t n : {int64_t{0}, kMaxContextTokens + 1, INT64_MAX})
    EXPECT_NE(error_of([&] { predict(cfg, hw, m, n); }).find("prompt length"), std::string::npos) << n;
  Mesh p2;
  p2.pp = 2;
  p2.pp_chunk = 1;
  EXPECT_NE(error_of([&] { predict(cfg, hw, p2, 1 << 20); }).find("use a chunk of at least 16"), std::string::npos);
  Mesh huge;
  huge.ring = 8192;
  EXPECT_NE(mesh_problem(cfg, hw, huge).find("not modelled"), std::string::npos);
}

TEST(PredictLimits, LargestLengthPredicts) {
  const model::ModelConfig cfg = testing::gpt_oss_120b();
  const HardwareProfile hw = testing::round_profile();
  for (const Mesh m : {Mesh{.pp_chunk = 0}, Mesh{.ring = 8, .pp_chunk = 0}, Mesh{.pp = 2, .pp_chunk = default_pipeline_chunk(2, kMaxContextTokens)}}) {
    const Prediction p = predict(cfg, hw, m, kMaxContextTokens);
    EXPECT_TRUE(std::isfinite(p.ttft_s) && p.ttft_s > 0) << m.str() << ": " << p.ttft_s;
    EXPECT_TRUE(std::isfinite(p.memory.total()) && p.memory.total() > 0) << m.str();
  }
}

}  // namespace
}  // namespace slope::planner
