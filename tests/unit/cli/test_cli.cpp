// The `slope` command line end to end: bad input gives a clear message and a non-zero exit,
// and a context-parallel run's KV shards, merged by `slope kv-merge`, equal the one-rank KV.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

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
  const auto moe = sh(kSlope + " run --model " + kModel + " --random-tokens 4 --moe-chunk 0");
  EXPECT_EQ(moe.code, 1);
  EXPECT_NE(moe.out.find("--moe-chunk must be positive"), std::string::npos) << moe.out;
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

// Under --tp a file holds the KV heads [kv_head0, kv_head0 + dim 1) of its rank; with more
// ranks than KV heads only the first rank holding each head writes it (docs/kv-format.md).
TEST(Cli, TensorParallelKvShardsHoldTheirHeadsAndMergeToOneRank) {
  fs::path d = temp_dir("kvtp");
  const std::string common = " run --model " + kModel + " --random-tokens 21 --seed 4 --dtype f32 --kv-out ";
  ASSERT_EQ(sh(kSlope + common + (d / "one").string()).code, 0);
  model::SafetensorsFile one((d / "one" / "kv.rank0-of-1.safetensors").string());
  // The tiny model has 4 query heads and 2 KV heads.
  for (int tp : {2, 4}) {
    const fs::path dir = d / ("tp" + std::to_string(tp));
    auto r = sh(kMpirun + "-np " + std::to_string(tp) + " " + kSlope + common + dir.string() + " --tp " + std::to_string(tp));
    ASSERT_EQ(r.code, 0) << r.out;
    const std::vector<int> writers = tp == 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
    for (int rank = 0; rank < tp; ++rank) {
      const fs::path f = dir / ("kv.rank" + std::to_string(rank) + "-of-" + std::to_string(tp) + ".safetensors");
      const bool writes = std::find(writers.begin(), writers.end(), rank) != writers.end();
      ASSERT_EQ(fs::exists(f), writes) << f;
      if (!writes) continue;
      model::SafetensorsFile shard(f.string());
      const int64_t head = rank * 2 / tp;  // KV head of this rank: query head rank*4/tp, 2 per KV head
      EXPECT_EQ(shard.metadata().at("kv_head0"), std::to_string(head)) << f;
      Tensor k = shard.get("layers.1.k"), ref = one.get("layers.1.k");
      ASSERT_EQ(k.shape(), (Shape{21, 1, ref.dim(2)})) << f;
      // The shard's one head equals head `head` of the one-rank cache.
      std::vector<float> want;
      for (int64_t p = 0; p < 21; ++p)
        for (int64_t x = 0; x < ref.dim(2); ++x) want.push_back(ref.data<float>()[(p * 2 + head) * ref.dim(2) + x]);
      EXPECT_LE(engine::relative_error(k.data<float>(), want.data(), int64_t(want.size())), 1e-4) << f;
    }
    const fs::path merged = d / ("merged" + std::to_string(tp) + ".safetensors");
    r = sh(kSlope + " kv-merge --dir " + dir.string() + " --out " + merged.string());
    ASSERT_EQ(r.code, 0) << r.out;
    model::SafetensorsFile m(merged.string());
    for (const std::string& name : one.names()) {
      if (name == "positions") continue;
      Tensor a = one.get(name), b = m.get(name);
      ASSERT_EQ(a.shape(), b.shape()) << name;
      EXPECT_LE(engine::relative_error(b.data<float>(), a.data<float>(), a.numel()), 1e-4) << name;
    }
  }
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

// Regression (issue 15, item 10): "3-4" was read as 3, -4; 20 digits gave "internal error:
// stoll"; a directory was "prompt is empty".
TEST(Cli, TokenFileErrorsAreClear) {
  fs::path d = temp_dir("tokfile");
  write_file(d / "dash.txt", "1 3-4 5");
  auto r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "dash.txt").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("'3-4' at byte 2 is not an integer token id"), std::string::npos) << r.out;
  write_file(d / "long.txt", "1 123456789012345678901234");
  r = sh(kSlope + " run --model " + kModel + " --tokens " + (d / "long.txt").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is out of range (token ids are 32-bit"), std::string::npos) << r.out;
  r = sh(kSlope + " run --model " + kModel + " --tokens " + d.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a directory; only regular files are accepted"), std::string::npos) << r.out;
}

// Regression (issue 15, defect 2): FIFOs in place of the weights, the config or the prompt
// made `slope run` wait forever. (timeout 30: a hang fails the test with exit code 124.)
TEST(Cli, FifoInputsAreRefused) {
  fs::path d = temp_dir("fifo");
  fs::create_directories(d / "m");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(kModel) / f, d / "m" / f);
  ASSERT_EQ(::mkfifo((d / "tokens").c_str(), 0644), 0);
  auto r = sh("timeout 30 " + kSlope + " run --model " + kModel + " --tokens " + (d / "tokens").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a FIFO (named pipe); only regular files are accepted"), std::string::npos) << r.out;
  for (const char* f : {"model.safetensors", "config.json"}) {
    fs::remove(d / "m" / f);
    ASSERT_EQ(::mkfifo((d / "m" / f).c_str(), 0644), 0);
    r = sh("timeout 30 " + kSlope + " run --model " + (d / "m").string() + " --random-tokens 4");
    EXPECT_EQ(r.code, 1) << f << ": " << r.out;
    EXPECT_NE(r.out.find(std::string(f) + " is a FIFO"), std::string::npos) << r.out;
    fs::remove(d / "m" / f);
    fs::copy_file(fs::path(kModel) / f, d / "m" / f);
  }
}

// Regression (issue 15, defects 5 and 9): outputs replaced a device node or a FIFO with a
// regular file (or blocked on the FIFO), and a bad --kv-out failed only after the prefill.
// Each is refused before any work and left as it was. The device is our own node (mknod, as
// root), never /dev/null itself.
TEST(Cli, OutputsRefuseDevicesFifosAndDirectories) {
  fs::path d = temp_dir("outdev");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  const bool have_dev = ::mknod((d / "null").c_str(), S_IFCHR | 0644, makedev(1, 3)) == 0;
  const std::string run = "timeout 60 " + kSlope + " run --model " + kModel + " --random-tokens 8 ";
  std::vector<std::pair<std::string, std::string>> cases = {
      {"--logits-out " + (d / "fifo").string(), "is a FIFO (named pipe); only a regular file or a new path is written"},
      {"--logits-out " + d.string(), "is a directory"},
      {"--kv-out " + (d / "fifo").string(), "is a FIFO (named pipe), not a directory"},
  };
  if (have_dev) {
    cases.push_back({"--logits-out " + (d / "null").string(), "is a character device"});
    cases.push_back({"--kv-out " + (d / "null").string(), "is a character device, not a directory"});
  }
  for (const auto& [flags, expect] : cases) {
    auto r = sh(run + flags);
    EXPECT_EQ(r.code, 1) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << flags << ": " << r.out;
    EXPECT_EQ(r.out.find("first token"), std::string::npos) << "the prefill ran first: " << r.out;
  }
  // A FIFO where this rank's shard file goes.
  fs::create_directories(d / "kv");
  ASSERT_EQ(::mkfifo((d / "kv" / "kv.rank0-of-1.safetensors").c_str(), 0644), 0);
  auto r = sh(run + "--kv-out " + (d / "kv").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kv.rank0-of-1.safetensors exists and is a FIFO"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));
  EXPECT_TRUE(fs::is_fifo(d / "kv" / "kv.rank0-of-1.safetensors"));

  // kv-merge --out.
  ASSERT_EQ(sh(run + "--kv-out " + (d / "good").string()).code, 0);
  const std::string merge = "timeout 60 " + kSlope + " kv-merge --dir " + (d / "good").string() + " --out ";
  r = sh(merge + (d / "fifo").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a FIFO"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));
  if (have_dev) {
    r = sh(merge + (d / "null").string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("is a character device"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::is_character_file(d / "null")) << "the device node was replaced";
  }
  EXPECT_EQ(sh(merge + (d / "merged.safetensors").string()).code, 0);
}

// Regression (issue 15, defect 6): rank 0 of one 2-rank prefill merged with rank 1 of another
// (same length, other seed) gave exit 0 and a mixed cache. So do two runs of the same prompt,
// and stale shards of an earlier run left in a --kv-out directory.
TEST(Cli, KvMergeRefusesShardsOfDifferentPrefills) {
  fs::path d = temp_dir("kvmix");
  const std::string common = kMpirun + "-np 2 " + kSlope + " run --model " + kModel + " --random-tokens 30 --ring 2 ";
  for (const char* run : {"a", "b", "c"}) {
    const std::string seed = std::string(run) == "b" ? "2" : "1";
    auto r = sh(common + "--seed " + seed + " --kv-out " + (d / run).string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string a0 = (d / "a" / "kv.rank0-of-2.safetensors").string();
  auto merge = [&](const std::string& other) {
    return sh(kSlope + " kv-merge " + a0 + " " + other + " --out " + (d / "m.safetensors").string());
  };
  for (const char* other : {"b", "c"}) {  // other tokens; same tokens, another run
    const std::string o1 = (d / other / "kv.rank1-of-2.safetensors").string();
    auto r = merge(o1);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(a0 + " and " + o1 + " come from different prefills"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("prefill_id"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("tokens_hash") != std::string::npos, std::string(other) == "b") << r.out;
  }
  EXPECT_FALSE(fs::exists(d / "m.safetensors"));
  EXPECT_EQ(merge((d / "a" / "kv.rank1-of-2.safetensors").string()).code, 0);
  // A one-rank run into the directory of the two-rank run: kv.rank0-of-1 is stale beside them.
  ASSERT_EQ(sh(kSlope + " run --model " + kModel + " --random-tokens 30 --seed 1 --kv-out " + (d / "a").string()).code, 0);
  auto r = sh(kSlope + " kv-merge --dir " + (d / "a").string() + " --out " + (d / "m.safetensors").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kv.rank0-of-1.safetensors and "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("come from different prefills"), std::string::npos) << r.out;
}

// Regression (issue 15, defect 6): a flipped byte in a KV file went unnoticed.
TEST(Cli, KvMergeCatchesFlippedBytes) {
  fs::path d = temp_dir("kvflip");
  ASSERT_EQ(sh(kSlope + " run --model " + kModel + " --random-tokens 20 --kv-out " + d.string()).code, 0);
  const fs::path shard = d / "kv.rank0-of-1.safetensors";
  const uintmax_t size = fs::file_size(shard);
  for (uintmax_t at : {size - 1, size - 3000}) {  // in layers.3.v and in an earlier tensor
    fs::copy_file(shard, d / "bad.safetensors", fs::copy_options::overwrite_existing);
    {
      std::fstream f(d / "bad.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(at));
      char c = 0;
      f.get(c);
      f.seekp(std::streamoff(at));
      f.put(char(c ^ 0x10));
    }
    auto r = sh(kSlope + " kv-merge " + (d / "bad.safetensors").string() + " --out " + (d / "m.safetensors").string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("fails its checksum"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sh(kSlope + " kv-merge " + shard.string() + " --out " + (d / "m.safetensors").string()).code, 0);
}

// Regression (issue 15, defect 7): with only stage 0's shard of a --pp 2 run, kv-merge wrote
// 2 of the model's 4 layers with exit 0. Now that needs --layers.
TEST(Cli, KvMergeRefusesAnIncompleteLayerSetUnlessAsked) {
  fs::path d = temp_dir("kvpp");
  auto pp = sh(kMpirun + "-np 2 " + kSlope + " run --model " + kModel + " --random-tokens 24 --pp 2 --kv-out " + d.string());
  ASSERT_EQ(pp.code, 0) << pp.out;
  const std::string s0 = (d / "kv.rank0-of-2.safetensors").string();
  const std::string out = (d / "m.safetensors").string();
  auto r = sh(kSlope + " kv-merge " + s0 + " --out " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("the shards hold layers 0,1 of the model's 4; layers 2,3 are in no shard"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--layers"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  r = sh(kSlope + " kv-merge " + s0 + " --layers 0-1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  model::SafetensorsFile m(out);
  EXPECT_EQ(m.names(), (std::vector<std::string>{"layers.0.k", "layers.0.v", "layers.1.k", "layers.1.v", "positions"}));
  EXPECT_EQ(m.metadata().at("layer_count"), "2");
  r = sh(kSlope + " kv-merge " + s0 + " --layers 0-2 --out " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("layers 2 are in no shard"), std::string::npos) << r.out;
  EXPECT_EQ(sh(kSlope + " kv-merge --dir " + d.string() + " --out " + out).code, 0);
  EXPECT_NE(sh(kSlope + " kv-merge " + s0 + " --layers 1-0 --out " + out).code, 0);
}

}  // namespace
