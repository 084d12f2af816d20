// `slope plan --predict`: one configuration's TTFT and phases from the cost model, as text and
// JSON; the pipeline chunk defaults to the engine's; bad meshes exit non-zero with a message.
// A missing slope binary fails every test (CMake builds it before this test binary).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../run_slope.h"

namespace {

// `slope plan --predict ARGS`.
slope::testing::CommandResult run(const std::string& args) {
  return slope::testing::run_slope("plan --predict " + args);
}

class CliPredict : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(SLOPE_BINARY))
        << "the slope binary is missing: " << SLOPE_BINARY << "; build the `slope` target first";
  }
};

TEST_F(CliPredict, JsonPerLengthWithPhases) {
  auto r = run("--model configs/gpt-oss-120b --hardware mi250-gcd --mesh 1,16,1,2 --context 32k,100000 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::string line;
  std::vector<nlohmann::json> js;
  for (size_t a = 0, b; (b = r.out.find('\n', a)) != std::string::npos; a = b + 1)
    js.push_back(nlohmann::json::parse(r.out.substr(a, b - a)));
  ASSERT_EQ(js.size(), 2u);
  EXPECT_EQ(js[0]["tokens"].get<int64_t>(), 32768);
  EXPECT_EQ(js[1]["tokens"].get<int64_t>(), 100000);
  for (const auto& j : js) {
    double sum = 0;
    for (const auto& [k, v] : j["phases_s"].items()) sum += v.get<double>();
    EXPECT_NEAR(sum, j["ttft_s"].get<double>(), 1e-9 * sum);
    EXPECT_EQ(j["mesh"]["R"].get<int>(), 16);
    EXPECT_EQ(j["mesh"]["TP"].get<int>(), 2);
    EXPECT_TRUE(j["fits"].get<bool>());
  }
  EXPECT_LT(js[0]["ttft_s"].get<double>(), js[1]["ttft_s"].get<double>());
}

TEST_F(CliPredict, PipelineChunkDefaultsToTheEngines) {
  // P = 2 at 4096 tokens: max(256, ceil(4096 / 8)) = 512 tokens, 8 chunks; an explicit 0 is
  // the whole prompt.
  auto r = run("--model configs/gpt-oss-20b --hardware mi250-gcd --mesh 1,1,2,1 --context 4096 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mesh"]["chunk"].get<int64_t>(), 512);
  EXPECT_EQ(j["chunks"].get<int64_t>(), 8);
  auto whole = run("--model configs/gpt-oss-20b --hardware mi250-gcd --mesh 1,1,2,1,0 --context 4096 --json");
  ASSERT_EQ(whole.code, 0) << whole.out;
  EXPECT_EQ(nlohmann::json::parse(whole.out)["chunks"].get<int64_t>(), 1);
  auto text = run("--model configs/gpt-oss-20b --hardware mi250-gcd --mesh 1,1,2,1 --context 4k");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("TTFT"), std::string::npos);
  EXPECT_NE(text.out.find("pipeline_fill"), std::string::npos);
}

TEST_F(CliPredict, BadMeshSaysWhatToWrite) {
  auto r = run("--model configs/gpt-oss-20b --hardware mi250-gcd --mesh 1,2 --context 4096");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("U,R,P,TP"), std::string::npos) << r.out;
  auto odd = run("--model configs/gpt-oss-20b --hardware mi250-gcd --mesh 3,1,1,1 --context 4096");
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.out.find("query heads"), std::string::npos) << odd.out;
}

// Issue 15, defect 1: absurd lengths used to overflow the cost model's chunk count and crash
// it (SIGSEGV, no message). They must exit 1 with a message, as must a chunk count too large.
TEST_F(CliPredict, AbsurdContextIsAnErrorNotACrash) {
  for (const std::string ctx : {"9223372036854775807", "9000000000000000k", "2049m", "99999999999999999999999"}) {
    auto r = run("--model configs/gpt-oss-120b --hardware profiles/h100-sxm.json --mesh 1,8,1,1 --context " + ctx);
    EXPECT_EQ(r.code, 1) << ctx << ": " << r.out;
    EXPECT_NE(r.out.find("2048m"), std::string::npos) << ctx << ": " << r.out;
  }
  // Lengths the model allows are planned (beyond them `slope plan` refuses, naming the limit):
  // gpt-oss-120b's shape with positions up to 2^32, so that the largest accepted length reaches
  // the cost model.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("slope_long_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(std::string(SLOPE_REFERENCE_DIR) + "/../../configs/gpt-oss-120b/config.json"));
  cfg["max_position_embeddings"] = int64_t{1} << 32;
  std::ofstream(dir / "config.json") << cfg.dump();
  const std::string model = "--model " + dir.string();
  auto chunks = run(model + " --hardware profiles/h100-sxm.json --mesh 1,1,2,1,1 --context 1m");
  EXPECT_EQ(chunks.code, 1) << chunks.out;
  EXPECT_NE(chunks.out.find("use a chunk of at least"), std::string::npos) << chunks.out;
  // The largest accepted length, on a small mesh, predicts.
  auto big = run(model + " --hardware profiles/h100-sxm.json --mesh 1,8,1,1 --context 2048m --json");
  ASSERT_EQ(big.code, 0) << big.out;
  EXPECT_EQ(nlohmann::json::parse(big.out)["tokens"].get<int64_t>(), int64_t{1} << 31);
}

}  // namespace
