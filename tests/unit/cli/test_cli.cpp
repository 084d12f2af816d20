// The `slope` command line end to end: bad input gives a clear message and a non-zero exit,
// and a context-parallel run's KV shards, merged by `slope kv-merge`, equal the one-rank KV.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../run_slope.h"
#include "slope/engine/distributed.h"
#include "slope/model/safetensors.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

// Runs a shell command; stdout and stderr together in .out.
slope::testing::CommandResult sh(const std::string& cmd) { return slope::testing::run_command(cmd); }

const std::string kSlope = SLOPE_BINARY;
const std::string kModel = std::string(SLOPE_REFERENCE_DIR) + "/fixtures/gpt_oss/model";
const std::string kMpirun = "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 ";

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("slope_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Cli, TokenIdOutsideVocabulary) {
  fs::path d = temp_dir("vocab");
  write_file(d / "t.txt", "1 2 3 512 4");  // the tiny model's vocabulary is 512
  auto r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "t.txt").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("token id 512 at position 3 is outside the vocabulary [0, 512)"), std::string::npos) << r.out;
}

TEST(Cli, NegativeTokenId) {
  fs::path d = temp_dir("neg");
  write_file(d / "t.txt", "5,-1");
  auto r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "t.txt").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("token id -1"), std::string::npos) << r.out;
}

TEST(Cli, EmptyPrompt) {
  fs::path d = temp_dir("empty");
  write_file(d / "t.txt", "  \n");
  auto r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "t.txt").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("prompt is empty"), std::string::npos) << r.out;
}

TEST(Cli, NotATokenFile) {
  fs::path d = temp_dir("garbage");
  write_file(d / "t.txt", "1 2 three");
  auto r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "t.txt").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("is not an integer token id"), std::string::npos) << r.out;
}

TEST(Cli, PromptLongerThanMaxPositions) {
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 5000");  // max 4096
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("more than the model's max_position_embeddings (4096)"), std::string::npos) << r.out;
}

TEST(Cli, MissingModelDirectory) {
  auto r = sh(kSlope + " run --model /nonexistent/model --random-tokens 4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;
}

// Exit codes (cli_util.h): 1 for a bad value, 2 for command-line usage.
TEST(Cli, BadFlagValues) {
  EXPECT_EQ(sh(kSlope + " run --model " + kModel + " --random-tokens 4 --dtype f8").code, 1);
  EXPECT_EQ(sh(kSlope + " run --model " + kModel + " --random-tokens 4 --chunk 0").code, 1);
  EXPECT_EQ(sh(kSlope + " frobnicate").code, 2);
  EXPECT_EQ(sh(kSlope + " run --model " + kModel + " --random-tokens 4 --no-such-flag").code, 2);
  EXPECT_EQ(sh(kSlope + " run --random-tokens 4").code, 2);  // --model is required
  EXPECT_EQ(sh(kSlope + " plan --predict --model configs/gpt-oss-120b").code, 2);
}

TEST(Cli, MeshNeedsMatchingRankCount) {
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 8 --ulysses 2 --ring 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("needs 4 ranks"), std::string::npos) << r.out;
}

TEST(Cli, JsonOutputAndLogits) {
  fs::path d = temp_dir("json");
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 40 --seed 3 --json --logits-out " +
                (d / "logits.bin").string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key : {"\"first_token\"", "\"top_logprobs\"", "\"num_tokens\":40", "\"ttft_ms\"",
                          "\"phases\"", "\"peak_memory_bytes\""})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " in " << r.out;
  EXPECT_EQ(fs::file_size(d / "logits.bin"), 512u * sizeof(float));
}

// KV written by every rank of a 4-rank mesh and merged equals the KV of one rank: rows split
// over context-parallel ranks, and (ring 2 x tp 2) heads split over tensor ranks as well.
void expect_merged_kv_equals_one_rank(const std::string& name, const std::string& mesh_flags) {
  fs::path d = temp_dir(name);
  const std::string common = " run --model " + kModel + " --random-tokens 77 --seed 5 --dtype f32 --kv-out ";
  auto one = sh(kSlope + common + (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  auto cp = sh(kMpirun + "-np 4 " + kSlope + common + (d / "cp").string() + " " + mesh_flags);
  ASSERT_EQ(cp.code, 0) << cp.out;
  auto merge = sh(kSlope + " kv-merge --dir " + (d / "cp").string() + " --out " + (d / "merged.safetensors").string());
  ASSERT_EQ(merge.code, 0) << merge.out;
  model::SafetensorsFile a((d / "one" / "kv.rank0-of-1.safetensors").string());
  model::SafetensorsFile b((d / "merged.safetensors").string());
  int compared = 0;
  for (const std::string& name : a.names()) {
    if (name == "positions") continue;
    Tensor ta = a.get(name), tb = b.get(name);
    ASSERT_EQ(ta.shape(), tb.shape()) << name;
    EXPECT_LE(engine::relative_error(tb.data<float>(), ta.data<float>(), ta.numel()), 1e-4) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 8);  // 4 layers x {k, v}
}

TEST(Cli, ContextParallelKvMergeEqualsOneRank) { expect_merged_kv_equals_one_rank("kvmerge", "--ulysses 2 --ring 2"); }

TEST(Cli, TensorTimesContextParallelKvMergeEqualsOneRank) {
  expect_merged_kv_equals_one_rank("kvmerge_tpcp", "--ring 2 --tp 2");
}

TEST(Cli, KvMergeRejectsIncompleteShards) {
  fs::path d = temp_dir("kvbad");
  auto cp = sh(kMpirun + "-np 2 " + kSlope + " run --model " + kModel +
                 " --random-tokens 30 --ring 2 --kv-out " + d.string());
  ASSERT_EQ(cp.code, 0) << cp.out;
  auto merge = sh(kSlope + " kv-merge " + (d / "kv.rank0-of-2.safetensors").string() + " --out " +
                    (d / "m.safetensors").string());
  EXPECT_NE(merge.code, 0);
  EXPECT_NE(merge.out.find("is in no shard"), std::string::npos) << merge.out;
}

// Several prompts are each reported with their own token count, first token and logprobs, and
// the batch's tokens/s counts every prompt's tokens.
TEST(Cli, SeveralPromptsReportedEach) {
  fs::path d = temp_dir("several");
  write_file(d / "p5.txt", "1 2 3 4 5");
  std::string hundred;
  for (int i = 0; i < 100; ++i) hundred += std::to_string((i * 37) % 500) + " ";
  write_file(d / "p100.txt", hundred);
  auto json_of = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{'))); };
  const std::string run = kSlope + " run --model " + kModel + " --dtype f32 --json";
  auto alone5 = sh(run + " --tokens " + (d / "p5.txt").string() + " 2>/dev/null");
  auto alone100 = sh(run + " --tokens " + (d / "p100.txt").string() + " 2>/dev/null");
  auto both = sh(run + " --tokens " + (d / "p5.txt").string() + " --tokens " + (d / "p100.txt").string() + " 2>/dev/null");
  ASSERT_EQ(alone5.code, 0) << alone5.out;
  ASSERT_EQ(alone100.code, 0) << alone100.out;
  ASSERT_EQ(both.code, 0) << both.out;
  const nlohmann::json j5 = json_of(alone5.out), j100 = json_of(alone100.out), jb = json_of(both.out);
  EXPECT_EQ(jb["num_tokens"].get<int64_t>(), 105);
  ASSERT_EQ(jb["prompts"].size(), 2u);
  EXPECT_EQ(jb["prompts"][0]["num_tokens"].get<int64_t>(), 5);
  EXPECT_EQ(jb["prompts"][1]["num_tokens"].get<int64_t>(), 100);
  EXPECT_EQ(jb["prompts"][0]["first_token"], j5["first_token"]);
  EXPECT_EQ(jb["prompts"][1]["first_token"], j100["first_token"]);
  EXPECT_EQ(jb["prompts"][1]["top_logprobs"][0]["token"], j100["top_logprobs"][0]["token"]);
  EXPECT_FALSE(jb.contains("first_token")) << "a batch has no single first token";
  EXPECT_NEAR(jb["tokens_per_s"].get<double>(), 105.0 / (jb["ttft_ms"].get<double>() / 1e3), 1e-6);
  auto text = sh(kSlope + " run --model " + kModel + " --dtype f32 --tokens " + (d / "p5.txt").string() +
                 " --tokens " + (d / "p100.txt").string());
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("tokens       105 in 2 prompts"), std::string::npos) << text.out;
}

// A prompt longer than the model allows is refused before its ids are drawn: under a 3 GB
// address-space limit, 10^9 random ids (4 GB) would fail to allocate instead.
TEST(Cli, TooManyRandomTokensRefusedBeforeAnyWork) {
  auto r = sh("ulimit -v 3000000; " + kSlope + " run --model " + kModel + " --random-tokens 1000000000");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--random-tokens 1000000000 is more than the model's max_position_embeddings (4096)"),
            std::string::npos) << r.out;
}

// Values that used to be silently ignored or replaced are refused, naming the flag.
TEST(Cli, OutOfRangeFlagValuesRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"--threads -3", "--threads must be positive"},
      {"--pp-chunk -5", "--pp-chunk must be a positive number of tokens"},
      {"--pp-chunk -1", "--pp-chunk must be a positive number of tokens"},
      {"--max-memory -1", "--max-memory must be a positive number of bytes"},
      {"--timeout 0", "--timeout must be a positive number of seconds"},
      {"--top-k 100000", "--top-k 100000 exceeds the vocabulary"},
  };
  for (const auto& [flags, message] : cases) {
    auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 10 " + flags);
    EXPECT_EQ(r.code, 1) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << ": " << r.out;
  }
  auto neg = sh(kSlope + " run --model " + kModel + " --random-tokens -4");
  EXPECT_EQ(neg.code, 1) << neg.out;
  EXPECT_NE(neg.out.find("--random-tokens must be positive"), std::string::npos) << neg.out;
}

}  // namespace
