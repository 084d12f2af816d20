// `slope run --prompt TEXT` and `--prompt-file F` end to end: a text prompt runs exactly as the
// ids `slope tokenize` gives for it (same first token and logprobs), the first token's text is
// reported when the model has a tokenizer.json, and bad input says what to fix.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../run_slope.h"

namespace fs = std::filesystem;

namespace {

slope::testing::CommandResult sh(const std::string& cmd, bool with_stderr = true) {
  return slope::testing::run_command(cmd, with_stderr);
}

const std::string kSlope = SLOPE_BINARY;
const fs::path kRoot = fs::path(SLOPE_REFERENCE_DIR) / ".." / "..";
const fs::path kFixture = fs::path(SLOPE_REFERENCE_DIR) / "fixtures" / "llama" / "model";  // vocab 512
const fs::path kTokenizers = kRoot / "tests" / "text" / "tokenizers";

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("slope_cli_prompt_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A copy of the tiny fixture model with the tokenizer of `family` next to it.
fs::path model_with_tokenizer(const std::string& name, const std::string& family) {
  fs::path d = temp_dir(name) / "model";
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(kFixture)) fs::copy_file(e.path(), d / e.path().filename());
  fs::copy_file(kTokenizers / family / "tokenizer.json", d / "tokenizer.json");
  return d;
}

nlohmann::json run_json(const std::string& args) {
  auto r = sh(kSlope + " run --dtype f32 --top-k 5 --json " + args, false);
  EXPECT_EQ(r.code, 0) << args << ": " << r.out;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

// The prompt as text and as the ids `slope tokenize` gives for it: the same run.
void expect_text_prompt_equals_ids(const fs::path& model, const std::string& text) {
  const fs::path dir = model.parent_path();
  write_file(dir / "prompt.txt", text);
  auto ids = sh(kSlope + " tokenize --model " + model.string() + " < " + (dir / "prompt.txt").string(), false);
  ASSERT_EQ(ids.code, 0) << ids.out;
  ASSERT_EQ(ids.out.rfind("436 ", 0), 0u) << ids.out;  // <|begin_of_text|> first
  write_file(dir / "ids.txt", ids.out);
  const nlohmann::json by_ids = run_json("--model " + model.string() + " --tokens " + (dir / "ids.txt").string());
  const nlohmann::json by_file = run_json("--model " + model.string() + " --prompt-file " + (dir / "prompt.txt").string());
  ASSERT_TRUE(by_ids.contains("first_token")) << by_ids;
  for (const nlohmann::json& j : {by_file}) {
    EXPECT_EQ(j["num_tokens"], by_ids["num_tokens"]);
    EXPECT_EQ(j["first_token"], by_ids["first_token"]);
    EXPECT_EQ(j["top_logprobs"], by_ids["top_logprobs"]);  // same ids, same arithmetic: equal bits
  }
  // The first token's text, as `slope tokenize --decode` gives it.
  write_file(dir / "first.txt", std::to_string(by_ids["first_token"].get<int>()));
  auto text_of = sh(kSlope + " tokenize --decode --model " + model.string() + " < " + (dir / "first.txt").string(), false);
  ASSERT_EQ(text_of.code, 0) << text_of.out;
  EXPECT_EQ(by_ids["first_token_text"], text_of.out);
  EXPECT_EQ(by_file["first_token_text"], text_of.out);
}

TEST(CliRunPrompt, TextPromptRunsAsItsTokenIds) {
  const fs::path model = model_with_tokenizer("same", "tiny_llama3");
  expect_text_prompt_equals_ids(model, "The quick brown fox jumps over the lazy dog.");
  expect_text_prompt_equals_ids(model, "def main():\n    print(\"h\u00e9llo w\u00f6rld\", 42)\n\n\u4f60\u597d \U0001F600\n");
  // --prompt TEXT is the same prompt as the file holding TEXT.
  const std::string text = "Long prompts are split over ranks";
  const nlohmann::json by_flag = run_json("--model " + model.string() + " --prompt '" + text + "'");
  write_file(model.parent_path() / "p.txt", text);
  const nlohmann::json by_file = run_json("--model " + model.string() + " --prompt-file " + (model.parent_path() / "p.txt").string());
  EXPECT_EQ(by_flag["num_tokens"], by_file["num_tokens"]);
  EXPECT_EQ(by_flag["first_token"], by_file["first_token"]);
  EXPECT_EQ(by_flag["top_logprobs"], by_file["top_logprobs"]);
  EXPECT_EQ(by_flag["first_token_text"], by_file["first_token_text"]);
}

TEST(CliRunPrompt, TextOutputNamesTheFirstToken) {
  const fs::path model = model_with_tokenizer("text", "tiny_llama3");
  const nlohmann::json j = run_json("--model " + model.string() + " --prompt 'hello world'");
  auto r = sh(kSlope + " run --dtype f32 --model " + model.string() + " --prompt 'hello world'", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string want = "first token  " + std::to_string(j["first_token"].get<int>()) + " (" +
                           nlohmann::json(j["first_token_text"].get<std::string>()).dump() + ")\n";
  EXPECT_NE(r.out.find(want), std::string::npos) << want << " in " << r.out;
}

TEST(CliRunPrompt, NoTokenizerNoFirstTokenText) {
  const fs::path d = temp_dir("notext");
  write_file(d / "t.txt", "1 2 3");
  const nlohmann::json j = run_json("--model " + kFixture.string() + " --tokens " + (d / "t.txt").string());
  EXPECT_TRUE(j.contains("first_token")) << j;
  EXPECT_FALSE(j.contains("first_token_text")) << j;
  auto r = sh(kSlope + " run --model " + kFixture.string() + " --tokens " + (d / "t.txt").string(), false);
  EXPECT_NE(r.out.find("first token  " + std::to_string(j["first_token"].get<int>()) + "\n"), std::string::npos) << r.out;
}

TEST(CliRunPrompt, BadInputSaysWhatToFix) {
  const fs::path model = model_with_tokenizer("bad", "tiny_llama3");
  const fs::path d = model.parent_path();
  write_file(d / "t.txt", "1 2 3");
  write_file(d / "bad.txt", "ok\xff");
  struct Case {
    std::string args, message;
    int code;
  };
  const Case cases[] = {
      {"--model " + kFixture.string() + " --prompt hi",
       "--prompt needs the model's tokenizer, and " + (kFixture / "tokenizer.json").string() +
           " does not exist; add the model's tokenizer.json there, or give token ids with --tokens FILE", 1},
      {"--model " + kFixture.string() + " --prompt-file " + (d / "t.txt").string(), "--prompt-file needs the model's tokenizer", 1},
      {"--model " + model.string() + " --prompt hi --tokens " + (d / "t.txt").string(), "excludes", 2},
      {"--model " + model.string() + " --prompt hi --random-tokens 4", "excludes", 2},
      {"--model " + model.string() + " --prompt hi --prompt-file " + (d / "t.txt").string(), "excludes", 2},
      {"--model " + model.string() + " --prompt-file " + (d / "t.txt").string() + " --tokens " + (d / "t.txt").string(), "excludes", 2},
      {"--model " + model.string() + " --prompt hi --batch 2", "--batch goes with --random-tokens", 1},
      {"--model " + model.string() + " --prompt-file " + (d / "absent.txt").string(), "absent.txt", 1},
      {"--model " + model.string() + " --prompt-file " + (d / "bad.txt").string(),
       "--prompt-file: input text is not valid UTF-8: byte 2", 1},
  };
  for (const Case& c : cases) {
    auto r = sh(kSlope + " run " + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
  }
}

TEST(CliRunPrompt, TokenizerOfAnotherModelIsRefused) {
  // The Llama-3 test tokenizer has 6025 tokens; its BOS (6000) is outside the tiny model's 512.
  const fs::path model = model_with_tokenizer("other", "llama3");
  auto r = sh(kSlope + " run --model " + model.string() + " --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--prompt: the tokenizer gives id 6000 at position 0, outside the model's vocabulary [0, 512); " +
                       model.string() + "/tokenizer.json does not belong to this model"),
            std::string::npos)
      << r.out;
  // An empty prompt with a tokenizer that adds no BOS is no tokens at all.
  const fs::path qwen = model_with_tokenizer("empty", "qwen2");
  r = sh(kSlope + " run --model " + qwen.string() + " --prompt ''");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--prompt gives no tokens"), std::string::npos) << r.out;
}

TEST(CliRunPrompt, UnloadableTokenizerIsAWarningForTokenIds) {
  const fs::path d = temp_dir("broken") / "model";
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(kFixture)) fs::copy_file(e.path(), d / e.path().filename());
  write_file(d / "tokenizer.json", "{\"model\": {\"type\": \"Unigram\"}}");
  write_file(d.parent_path() / "t.txt", "1 2 3");
  auto r = sh(kSlope + " run --model " + d.string() + " --tokens " + (d.parent_path() / "t.txt").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("slope run: warning: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the first token is shown as an id only"), std::string::npos) << r.out;
  r = sh(kSlope + " run --model " + d.string() + " --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
}

}  // namespace
