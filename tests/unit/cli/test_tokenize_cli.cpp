// `slope tokenize` end to end on the committed Llama-3-style test tokenizer: text to ids with
// BOS, ids back to text, one request per line; bad input exits 1 with a message that says what
// to fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "../run_slope.h"

namespace {

using slope::testing::CommandResult;

// `slope tokenize ARGS` with `input` on stdin.
CommandResult tokenize(const std::string& args, const std::string& input, bool with_stderr = true) {
  const auto path = std::filesystem::temp_directory_path() / ("slope_tokenize_" + std::to_string(getpid()) + ".txt");
  std::ofstream(path, std::ios::binary) << input;
  auto r = slope::testing::run_slope("tokenize " + args + " < " + path.string(), with_stderr);
  std::filesystem::remove(path);
  return r;
}

const std::string kModel = "--model tests/text/tokenizers/llama3";

TEST(CliTokenize, EncodesAndDecodes) {
  auto r = tokenize(kModel, "Hello world", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("6000 ", 0), 0u) << r.out;  // <|begin_of_text|> first
  auto d = tokenize(kModel + " --decode --skip-special", r.out, false);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(d.out, "Hello world");
  auto n = tokenize(kModel + " --no-special", "Hello world", false);
  EXPECT_EQ("6000 " + n.out, r.out);
}

TEST(CliTokenize, LinesAndJsonDecoding) {
  auto r = tokenize(kModel + " --lines --no-special", "ab\ncd\n", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  auto d = tokenize(kModel + " --lines --decode", "198\n6000\n", false);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(d.out, "\"\\n\"\n\"<|begin_of_text|>\"\n");
}

TEST(CliTokenize, BadInputSaysWhatToFix) {
  auto r = tokenize("--model /nonexistent", "x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cannot read tokenizer"), std::string::npos) << r.out;
  r = tokenize(kModel + " --decode", "12 x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'x' on input line 1 is not a token id"), std::string::npos) << r.out;
  r = tokenize(kModel + " --decode", "99999999");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("not in the tokenizer's vocabulary"), std::string::npos) << r.out;
  r = tokenize(kModel + " --lines", "ok\nbad\xff\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("input line 2: input text is not valid UTF-8: byte 3"), std::string::npos) << r.out;
}

// --chat: the rendered text (--render), and ids that are the text's encoding without BOS (the
// text carries its own); bad messages say what is wrong.
TEST(CliTokenize, Chat) {
  const std::string messages = "[{\"role\": \"user\", \"content\": \"Hello world\"}]";
  auto text = tokenize(kModel + " --chat llama3 --render", messages, false);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_EQ(text.out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello world<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto ids = tokenize(kModel + " --chat llama3", messages, false);
  ASSERT_EQ(ids.code, 0) << ids.out;
  EXPECT_EQ(ids.out, tokenize(kModel + " --no-special", text.out, false).out);
  EXPECT_EQ(ids.out.rfind("6000 ", 0), 0u) << ids.out;  // one BOS, from the template
  auto r = tokenize(kModel + " --chat llama3", "[{\"role\": \"tool\", \"content\": \"x\"}]");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("role 'tool' is not supported"), std::string::npos) << r.out;
  r = tokenize(kModel + " --chat jinja", messages);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown chat format 'jinja'"), std::string::npos) << r.out;
}

}  // namespace
