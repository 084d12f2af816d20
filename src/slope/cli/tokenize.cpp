// `slope tokenize --model DIR`: text on stdin to token ids on stdout with DIR/tokenizer.json,
// or ids back to text with --decode. --lines treats each input line as its own request.
#include <filesystem>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/text/chat.h"
#include "slope/text/tokenizer.h"

namespace slope::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& line, int64_t line_no) {
  std::vector<int32_t> ids;
  std::string word;
  std::istringstream in(line);
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SLOPE_CHECK(used == word.size() && v >= 0 && v < (1LL << 31), "--decode: '", word, "' on input line ", line_no,
                " is not a token id; pass ids as non-negative integers separated by spaces");
    ids.push_back(int32_t(v));
  }
  return ids;
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ' ';
    out += std::to_string(ids[k]);
  }
  out += '\n';
  std::cout << out;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  std::string model;
  bool decode = false, lines = false, no_special = false, skip_special = false;
  std::string chat, date;
  bool render = false, no_generation_prompt = false;
  CLI::App app{"Encode text (stdin) to token ids with a Hugging Face tokenizer.json, or --decode ids to text",
               "slope tokenize"};
  setup_app(app);
  app.add_option("--model", model, "model directory holding tokenizer.json, or the tokenizer.json file")->required();
  app.add_flag("--decode", decode, "read token ids (whitespace separated) and write their text");
  app.add_flag("--lines", lines,
               "one request per input line: ids of each line on its own output line; with --decode, each "
               "line's text as a JSON string on its own line");
  app.add_flag("--no-special", no_special, "encode without the post-processor's special tokens (BOS)");
  app.add_flag("--skip-special", skip_special, "decode without special tokens");
  auto* chat_opt = app.add_option("--chat", chat,
                                  "stdin is a JSON array of {role, content} messages, rendered in chat FORMAT "
                                  "(harmony, llama3 or chatml) and encoded without the post-processor (the text "
                                  "carries its own BOS)");
  app.add_flag("--render", render, "with --chat: print the rendered prompt text instead of its ids")->needs(chat_opt);
  app.add_option("--date", date, "with --chat harmony: the system message's \"Current date: \" (YYYY-MM-DD)")->needs(chat_opt);
  app.add_flag("--no-generation-prompt", no_generation_prompt, "with --chat: end after the last message")->needs(chat_opt);
  chat_opt->excludes(app.get_option("--decode"))->excludes(app.get_option("--lines"))->excludes(app.get_option("--no-special"));
  if (const int code = parse_args(app, argc, argv, "tokenize"); code >= 0) return code;
  const std::string path = std::filesystem::is_directory(model) ? (std::filesystem::path(model) / "tokenizer.json").string() : model;
  const text::Tokenizer tok = text::Tokenizer::from_file(path);
  std::ios::sync_with_stdio(false);
  const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  if (!chat.empty()) {
    text::ChatOptions o;
    o.add_generation_prompt = !no_generation_prompt;
    o.date = date;
    const std::string prompt = text::render_chat(text::parse_chat_format(chat), text::parse_chat_messages(input), o);
    if (render) std::cout << prompt;
    else print_ids(tok.encode(prompt, false));
    return 0;
  }
  if (!lines) {
    if (decode) std::cout << tok.decode(parse_ids(input, 1), skip_special);
    else print_ids(tok.encode(input, !no_special));
    return 0;
  }
  std::istringstream in(input);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    try {
      if (decode) std::cout << nlohmann::json(tok.decode(parse_ids(line, n), skip_special)).dump() << '\n';
      else print_ids(tok.encode(line, !no_special));
    } catch (const Error& e) {
      fail("input line ", n, ": ", e.what());
    }
  }
  return 0;
}

}  // namespace slope::cli
