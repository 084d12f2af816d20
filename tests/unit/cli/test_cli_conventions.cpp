// What a new user meets first, end to end through the binary: --version, --help with defaults,
// one dtype spelling, exit codes, dry runs of any mesh from one process, progress lines only on
// a terminal, errors printed once under mpirun, the installed binary finding its data from
// anywhere, and `slope plan` explaining its output and refusing lengths the model cannot take.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "../run_slope.h"

namespace fs = std::filesystem;

namespace {

slope::testing::CommandResult sh(const std::string& cmd) { return slope::testing::run_command(cmd); }

const std::string kSlope = SLOPE_BINARY;
const std::string kModel = std::string(SLOPE_REFERENCE_DIR) + "/fixtures/gpt_oss/model";  // 4 layers
const std::string kMpirun = "mpirun --allow-run-as-root --oversubscribe ";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("slope_conv_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(CliConventions, VersionEverywhere) {
  for (const std::string& cmd : {"--version", "run --version", "plan --version", "kv-merge --version"}) {
    auto r = sh(kSlope + " " + cmd);
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.out;
    EXPECT_EQ(r.out.rfind("slope " SLOPE_VERSION " (commit ", 0), 0u) << cmd << ": " << r.out;
  }
}

TEST(CliConventions, HelpShowsDefaultsAndOneDtypeDefault) {
  auto run = sh(kSlope + " run --help");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("--dtype TEXT=bf16"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--chunk INT=1024"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--moe-chunk INT=4096"), std::string::npos) << run.out;
  auto predict = sh(kSlope + " plan --predict --help");
  ASSERT_EQ(predict.code, 0) << predict.out;
  EXPECT_NE(predict.out.find("--dtype TEXT=bf16"), std::string::npos) << predict.out;
  auto calibrate = sh(kSlope + " calibrate --help");
  ASSERT_EQ(calibrate.code, 0) << calibrate.out;
  EXPECT_NE(calibrate.out.find("--dtype TEXT=bf16"), std::string::npos) << calibrate.out;
}

TEST(CliConventions, DtypeSpelledTheSameEverywhere) {
  // f32 is the spelling; fp32 is accepted as well, in run and in the planner.
  for (const char* d : {"f32", "fp32", "bf16"}) {
    auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 9 --json --dtype " + d);
    ASSERT_EQ(r.code, 0) << d << ": " << r.out;
    auto p = slope::testing::run_slope(
        std::string("plan --predict --model configs/gpt-oss-20b --hardware cpu-zen4-2c --mesh 1,1,1,1 --context 4k --dtype ") + d);
    EXPECT_EQ(p.code, 0) << d << ": " << p.out;
  }
  auto bad = sh(kSlope + " run --model " + kModel + " --random-tokens 9 --dtype f8");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("--dtype must be f32 or bf16"), std::string::npos) << bad.out;
}

// --bf16-units: the run says which units it ran on; on the f32 units bf16 holds the weights
// --dtype f32 holds (f32 copies), and the two units' first tokens agree up to bf16 rounding.
TEST(CliConventions, Bf16UnitsAreChosenAndReported) {
  const std::string run = kSlope + " run --model " + kModel + " --random-tokens 40 --seed 4 --json";
  auto json_of = [](const slope::testing::CommandResult& r) { return nlohmann::json::parse(r.out); };
  auto f32_units = slope::testing::run_command(run + " --bf16-units f32", false);
  auto f32 = slope::testing::run_command(run + " --dtype f32", false);
  auto autos = slope::testing::run_command(run, false);
  ASSERT_EQ(f32_units.code, 0) << f32_units.out;
  ASSERT_EQ(f32.code, 0) << f32.out;
  ASSERT_EQ(autos.code, 0) << autos.out;
  const nlohmann::json ju = json_of(f32_units), jf = json_of(f32), ja = json_of(autos);
  EXPECT_EQ(ju["bf16_units"], "f32");
  EXPECT_FALSE(jf.contains("bf16_units")) << "an f32 run has no bf16 units";
  EXPECT_TRUE(ja["bf16_units"] == "bf16" || ja["bf16_units"] == "f32") << ja.dump();
  EXPECT_EQ(ju["weight_bytes"], jf["weight_bytes"]);
  auto native = slope::testing::run_command(run + " --bf16-units bf16", false);
  if (native.code == 0) {  // oneDNN has a bf16 matmul here
    const nlohmann::json jn = json_of(native);
    EXPECT_EQ(jn["bf16_units"], "bf16");
    // The same numbers up to bf16 rounding: each run's first token is among the other's top 5.
    auto in_top = [](const nlohmann::json& token, const nlohmann::json& j) {
      for (const auto& t : j["top_logprobs"])
        if (t["token"] == token) return true;
      return false;
    };
    EXPECT_TRUE(in_top(jn["first_token"], ju)) << jn.dump() << "\n" << ju.dump();
    EXPECT_TRUE(in_top(ju["first_token"], jn)) << jn.dump() << "\n" << ju.dump();
    EXPECT_LT(jn["weight_bytes"].get<double>(), 0.75 * ju["weight_bytes"].get<double>());
  } else {
    auto err = sh(run + " --bf16-units bf16");
    EXPECT_NE(err.out.find("no bf16 matmul on this CPU"), std::string::npos) << err.out;
  }
  // A dry run predicts the f32 copies: the same memory per rank as --dtype f32 (the line after
  // the two header lines, which name the dtype).
  auto rank_line = [](const std::string& out) {
    size_t at = 0;
    for (int i = 0; i < 2 && at != std::string::npos; ++i) at = out.find('\n', at + 1);
    return at == std::string::npos ? std::string() : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  const std::string dry = kSlope + " run --model " + kModel + " --random-tokens 4096 --dry-run";
  auto dry_units = sh(dry + " --bf16-units f32"), dry_f32 = sh(dry + " --dtype f32");
  ASSERT_EQ(dry_units.code, 0) << dry_units.out;
  ASSERT_EQ(dry_f32.code, 0) << dry_f32.out;
  EXPECT_FALSE(rank_line(dry_units.out).empty()) << dry_units.out;
  EXPECT_EQ(rank_line(dry_units.out), rank_line(dry_f32.out)) << dry_units.out << dry_f32.out;
  auto bad = sh(run + " --bf16-units fp32");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--bf16-units"), std::string::npos) << bad.out;
}

TEST(CliConventions, UsageErrorsExitTwoAndSayHowToGetHelp) {
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 4 --frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("usage error"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("slope run --help"), std::string::npos) << r.out;
}

// --device cuda on a build without the CUDA backend (this one) is a clear input error, not a
// crash or a silent CPU run.
TEST(CliConventions, DeviceCudaWithoutTheBackendSaysHowToGetIt) {
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 4 --device cuda");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("built without CUDA"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--preset cuda"), std::string::npos) << r.out;
  auto bad = sh(kSlope + " run --model " + kModel + " --random-tokens 4 --device tpu");
  EXPECT_EQ(bad.code, 2) << bad.out;
}

// A dry run computes nothing: it predicts any mesh's memory from one process.
TEST(CliConventions, DryRunOfAnyMeshFromOneProcess) {
  auto r = sh(kSlope + " run --model " + kModel + " --random-tokens 300 --pp 4 --dry-run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("pp=4 ring=1 ulysses=1 tp=1"), std::string::npos) << r.out;
  for (const char* row : {"   0     0", "   1     1", "   2     2", "   3     3"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " in " << r.out;
  auto mixed = sh(kSlope + " run --model " + kModel + " --random-tokens 300 --pp 2 --ulysses 2 --ring 2 --dry-run");
  ASSERT_EQ(mixed.code, 0) << mixed.out;
  EXPECT_NE(mixed.out.find("   7     1"), std::string::npos) << mixed.out;  // 8 ranks, the last in stage 1
  // An impossible mesh is still refused, naming the problem.
  auto bad = sh(kSlope + " run --model " + kModel + " --random-tokens 300 --pp 5 --dry-run");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("exceeds the model's 4 layers"), std::string::npos) << bad.out;
  // Without --dry-run the mesh needs its ranks, and the message says how to start them.
  auto real = sh(kSlope + " run --model " + kModel + " --random-tokens 300 --ring 2");
  EXPECT_EQ(real.code, 1);
  EXPECT_NE(real.out.find("--ring 2 needs 2 ranks, but 1 rank was started; launch it with `mpirun -np 2"),
            std::string::npos) << real.out;
}

// Progress lines appear on a terminal (a pseudo-terminal from script(1)) and nowhere else.
TEST(CliConventions, ProgressOnlyOnATerminal) {
  const std::string run = kSlope + " run --model " + kModel + " --random-tokens 200 --dtype f32";
  auto tty = sh("script -qec '" + run + "' /dev/null");
  ASSERT_EQ(tty.code, 0) << tty.out;
  EXPECT_NE(tty.out.find("layer 4/4"), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("prefill: 200/200 tokens"), std::string::npos) << tty.out;
  auto quiet = sh("script -qec '" + run + " --quiet' /dev/null");
  ASSERT_EQ(quiet.code, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("layer 4/4"), std::string::npos) << quiet.out;
  auto pipe = sh(run);
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_EQ(pipe.out.find('\r'), std::string::npos) << pipe.out;
  EXPECT_EQ(pipe.out.find("layer 4/4"), std::string::npos) << pipe.out;
}

// Under mpirun a user's mistake is printed by one rank, not by each.
TEST(CliConventions, ErrorPrintedOnceUnderMpirun) {
  auto shape = sh(kMpirun + "-np 3 " + kSlope + " run --model " + kModel + " --random-tokens 30 --ring 2");
  EXPECT_NE(shape.code, 0);
  EXPECT_EQ(count(shape.out, "needs 2 ranks"), 1u) << shape.out;
  auto tokens = sh(kMpirun + "-np 2 " + kSlope + " run --model " + kModel + " --random-tokens 5000 --ring 2");
  EXPECT_NE(tokens.code, 0);
  EXPECT_EQ(count(tokens.out, "max_position_embeddings"), 1u) << tokens.out;
  auto usage = sh(kMpirun + "-np 2 " + kSlope + " run --model " + kModel + " --random-tokens 30 --frobnicate");
  EXPECT_NE(usage.code, 0);
  EXPECT_EQ(count(usage.out, "usage error"), 1u) << usage.out;
}

// Threads per rank default to the node's cores shared by its ranks (MPI_COMM_TYPE_SHARED).
TEST(CliConventions, DefaultThreadsShareTheNode) {
  const int cores = int(std::thread::hardware_concurrency());
  // stdout only: the JSON (a CPU without AVX512-BF16 also logs a line to stderr).
  auto one = slope::testing::run_command(kSlope + " run --model " + kModel + " --random-tokens 9 --json", false);
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(nlohmann::json::parse(one.out)["threads_per_rank"].get<int>(), cores) << one.out;
  auto two = slope::testing::run_command(
      kMpirun + "-np 2 " + kSlope + " run --model " + kModel + " --random-tokens 9 --ring 2 --json", false);
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_EQ(nlohmann::json::parse(two.out)["threads_per_rank"].get<int>(), std::max(1, cores / 2)) << two.out;
}

// `cmake --install` puts the binary, configs and profiles under a prefix, and the installed
// binary finds them by name from any directory.
TEST(CliConventions, InstalledBinaryFindsItsDataFromAnywhere) {
  const fs::path build = fs::path(kSlope).parent_path();
  const fs::path prefix = temp_dir("install") / "prefix";
  auto inst = sh("cmake --install " + build.string() + " --prefix " + prefix.string());
  ASSERT_EQ(inst.code, 0) << inst.out;
  ASSERT_TRUE(fs::exists(prefix / "share/slope/profiles/mi250-gcd.json"));
  ASSERT_TRUE(fs::exists(prefix / "share/slope/configs/gpt-oss-120b/config.json"));
  auto r = sh("cd / && " + (prefix / "bin/slope").string() +
              " plan --model gpt-oss-120b --hardware mi250-gcd --nodes 4 --devices-per-node 8 --context 32k --ttft-slo 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("context 32768 tokens"), std::string::npos) << r.out;
  auto missing = sh("cd / && " + (prefix / "bin/slope").string() +
                    " plan --predict --model gpt-oss-120b --hardware no-such-gpu --mesh 1,1,1,1 --context 1k");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("no hardware profile named 'no-such-gpu'"), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find((prefix / "share/slope/profiles").string()), std::string::npos) << missing.out;
}

TEST(CliConventions, PlanExplainsItsOutput) {
  auto r = slope::testing::run_slope(
      "plan --model configs/gpt-oss-120b --hardware mi250-gcd --nodes 4 --devices-per-node 8 --context 100k --ttft-slo 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("legend:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("req/s@SLO = "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("100k = 102,400 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("context 102400 tokens"), std::string::npos) << r.out;
  auto p = slope::testing::run_slope(
      "plan --predict --model configs/gpt-oss-120b --hardware mi250-gcd --mesh 1,16,2,1 --context 32k");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("U Ulysses degree, R ring degree, P pipeline stages"), std::string::npos) << p.out;
}

TEST(CliConventions, PlanRefusesLengthsBeyondTheModel) {
  // gpt-oss-120b takes 131,072 positions; 1m is 1,048,576 tokens.
  auto r = slope::testing::run_slope(
      "plan --model configs/gpt-oss-120b --hardware mi250-gcd --nodes 4 --context 32k,1m --ttft-slo 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--context 1048576 tokens is longer than"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_position_embeddings 131072"), std::string::npos) << r.out;
  auto p = slope::testing::run_slope(
      "plan --predict --model configs/gpt-oss-120b --hardware mi250-gcd --mesh 1,16,2,1 --context 200k");
  EXPECT_EQ(p.code, 1);
  EXPECT_NE(p.out.find("max_position_embeddings 131072"), std::string::npos) << p.out;
}

// A FIFO given as the planner's model config or hardware profile is refused, not waited on.
TEST(CliConventions, PlannerRefusesFifoInputs) {
  const fs::path d = temp_dir("planfifo");
  const std::string fifo = (d / "fifo.json").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto hw = slope::testing::run_slope("plan --predict --model configs/gpt-oss-20b --hardware " + fifo +
                                      " --mesh 1,1,1,1 --context 1k");
  EXPECT_EQ(hw.code, 1) << hw.out;
  EXPECT_NE(hw.out.find("FIFO"), std::string::npos) << hw.out;
  auto model = slope::testing::run_slope("plan --predict --model " + fifo + " --hardware h100-sxm --mesh 1,1,1,1 --context 1k");
  EXPECT_EQ(model.code, 1) << model.out;
  EXPECT_NE(model.out.find("FIFO"), std::string::npos) << model.out;
}

}  // namespace
