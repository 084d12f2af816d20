// `slope plan` end to end: its JSON on a shipped profile parses and every listed deployment
// meets the SLO; bad flags and files exit non-zero with a message that says what to fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../run_slope.h"

namespace {

// `slope plan ARGS`.
slope::testing::CommandResult run(const std::string& args, bool with_stderr) {
  return slope::testing::run_slope("plan " + args, with_stderr);
}

TEST(CliPlan, JsonOnShippedProfileMeetsTheSlo) {
  auto r = run("--model configs/gpt-oss-120b/config.json --hardware profiles/mi250-gcd.json --nodes 4 "
                 "--devices-per-node 8 --context 32k,64k,100000 --ttft-slo 2 --json",
                 false);
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["contexts"].size(), 3u);
  EXPECT_EQ(j["contexts"][2]["tokens"].get<int64_t>(), 100000);
  for (const auto& c : j["contexts"]) {
    ASSERT_FALSE(c["deployments"].empty()) << c["tokens"];
    for (const auto& d : c["deployments"]) {
      EXPECT_TRUE(d["meets_slo"].get<bool>()) << d["name"];
      EXPECT_LE(d["ttft_s"].get<double>(), 2.0) << d["name"];
      EXPECT_LE(d["memory_per_rank_bytes"]["total"].get<double>(), d["memory_per_rank_bytes"]["capacity"].get<double>());
      EXPECT_EQ(d["instances"].get<int>() * d["mesh"]["ranks"].get<int>(), 32);
    }
    EXPECT_EQ(c["tp_baseline"]["mesh"]["TP"].get<int>(), 8);
  }
}

TEST(CliPlan, TextAndCurves) {
  const auto csv = std::filesystem::temp_directory_path() / ("slope_plan_curves_" + std::to_string(getpid()) + ".csv");
  auto r = run("--model configs/gpt-oss-120b --hardware mi250-gcd --nodes 4 --context 32k --ttft-slo 0.05 "
                 "--curve-out " + csv.string(), true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no deployment meets the 0.050 s SLO; the best reachable TTFT is"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("baseline 4x TP8"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(csv));
  std::filesystem::remove(csv);
}

TEST(CliPlan, BadInputSaysWhatToFix) {
  const std::string base = "--model configs/gpt-oss-120b --hardware mi250-gcd --nodes 4 --ttft-slo 1 ";
  struct Case { std::string args, message; };
  const Case cases[] = {
      {base + "--context 32q", "--context entry '32q' is not a positive token count"},
      {base + "--context 0", "is not a positive token count"},
      {"--model configs/none --hardware mi250-gcd --nodes 4 --ttft-slo 1 --context 32k", "cannot read model config"},
      {"--model configs/gpt-oss-120b --hardware nope --nodes 4 --ttft-slo 1 --context 32k",
       "no hardware profile named 'nope'"},
      {"--model configs/gpt-oss-120b --hardware mi250-gcd --nodes 0 --ttft-slo 1 --context 32k",
       "--nodes must be at least 1"},
      {"--model configs/gpt-oss-120b --hardware mi250-gcd --nodes 4 --ttft-slo -2 --context 32k",
       "--ttft-slo must be a positive number"},
  };
  for (const Case& c : cases) {
    auto r = run(c.args, true);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
