#include "slope/cli/tokens.h"

#include <cctype>
#include <fstream>
#include <random>
#include <sstream>

#include "slope/core/error.h"

namespace slope::cli {

std::vector<int32_t> read_token_file(const std::string& path) {
  std::ifstream f(path);
  SLOPE_CHECK(f, "cannot open token file '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    const char ch = s[i];
    if (std::isspace(static_cast<unsigned char>(ch)) || ch == ',' || ch == '[' || ch == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    if (s[j] == '-' || s[j] == '+') ++j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    const std::string word = s.substr(i, j - i);
    SLOPE_CHECK(j > i && std::isdigit(static_cast<unsigned char>(word.back())) &&
                    (j == s.size() || !std::isalnum(static_cast<unsigned char>(s[j]))),
                "token file '", path, "': '", s.substr(i, std::min<size_t>(20, s.size() - i)),
                "' at byte ", i, " is not an integer token id");
    const long long v = std::stoll(word);
    SLOPE_CHECK(v >= INT32_MIN && v <= INT32_MAX, "token file '", path, "': id ", word,
                " does not fit in 32 bits");
    out.push_back(int32_t(v));
    i = j;
  }
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  SLOPE_CHECK(n > 0, "--random-tokens must be positive, got ", n);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> out(n);
  for (auto& t : out) t = dist(rng);
  return out;
}

}  // namespace slope::cli
