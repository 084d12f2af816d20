// Single-thread encode speed of slope::text::Tokenizer on a text file: the whole file as one
// text, each line as its own request, and a prompt of about 100K tokens (the first lines)
// encoded by a freshly loaded tokenizer, so its word cache starts empty.
//
//   bench_tokenizer tests/text/tokenizers/llama3/tokenizer.json CORPUS
// (CORPUS from `python tests/text/make_corpus.py CORPUS`; bench/tokenizer_reference.py times
// PyPI `tokenizers` and tiktoken on the same file.)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/text/tokenizer.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_JSON TEXT_FILE\n");
    return 2;
  }
  try {
    std::ifstream in(argv[2], std::ios::binary);
    SLOPE_CHECK(in, "cannot read ", argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const double mb = double(text.size()) / 1e6;
    std::vector<std::string_view> lines;
    for (size_t b = 0; b < text.size();) {
      size_t e = text.find('\n', b);
      if (e == std::string::npos) e = text.size();
      lines.push_back(std::string_view(text).substr(b, e - b));
      b = e + 1;
    }
    for (int pass = 0; pass < 2; ++pass) {
      const slope::text::Tokenizer tok = slope::text::Tokenizer::from_file(argv[1]);
      double t0 = now();
      const size_t n = tok.encode(text, false).size();
      const double whole = now() - t0;
      t0 = now();
      size_t nl = 0;
      for (std::string_view l : lines) nl += tok.encode(l, false).size();
      const double per_line = now() - t0;
      std::printf("%s cache: whole text %.1f MB, %zu tokens: %.3f s, %.2f MB/s, %.2fM tokens/s | %zu lines: %.3f s, %.2f MB/s, %.2fM tokens/s\n",
                  pass == 0 ? "cold" : "fresh tokenizer again", mb, n, whole, mb / whole, double(n) / whole / 1e6,
                  lines.size(), per_line, mb / per_line, double(nl) / per_line / 1e6);
    }
    // A 100K-token prompt: the first lines of the text that hold 100K tokens between them.
    const slope::text::Tokenizer probe = slope::text::Tokenizer::from_file(argv[1]);
    size_t end = 0, counted = 0;
    for (std::string_view l : lines) {
      if (counted >= 100000) break;
      counted += probe.encode(l, false).size() + 1;
      end = size_t(l.data() - text.data()) + l.size() + 1;
    }
    const std::string prompt = text.substr(0, std::min(end, text.size()));
    const slope::text::Tokenizer fresh = slope::text::Tokenizer::from_file(argv[1]);
    double t0 = now();
    const size_t np = fresh.encode(prompt).size();
    const double cold = now() - t0;
    t0 = now();
    fresh.encode(prompt);
    const double warm = now() - t0;
    std::printf("prompt of %zu tokens (%zu bytes): %.1f ms with an empty cache, %.1f ms again\n", np, prompt.size(),
                cold * 1e3, warm * 1e3);
  } catch (const slope::Error& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
