#include "slope/model/token_file.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "slope/core/error.h"
#include "slope/core/file_io.h"

namespace slope::model {
namespace {

bool is_separator(char ch) {
  return std::isspace(static_cast<unsigned char>(ch)) || ch == ',' || ch == '[' || ch == ']';
}
bool is_digit(char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; }

}  // namespace

std::vector<int32_t> parse_token_ids(const std::string& s, const std::string& source) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    if (is_separator(s[i])) {
      ++i;
      continue;
    }
    // One word: everything up to the next separator. It must be [+-]digits, nothing more, so
    // "3-4" or "12abc" is an error rather than two ids or a truncated one.
    size_t end = i;
    while (end < s.size() && !is_separator(s[end])) ++end;
    const std::string word = s.substr(i, end - i);
    const size_t sign = (word[0] == '-' || word[0] == '+') ? 1 : 0;
    const bool digits = word.size() > sign && std::all_of(word.begin() + long(sign), word.end(), is_digit);
    SLOPE_CHECK(digits, "token file '", source, "': '", word.substr(0, 24), word.size() > 24 ? "..." : "",
                "' at byte ", i, " is not an integer token id");
    // Accumulate with an overflow check instead of stoll, whose out_of_range is not a user error.
    int64_t v = 0;
    for (size_t k = sign; k < word.size(); ++k) {
      v = v * 10 + (word[k] - '0');
      SLOPE_CHECK(v <= int64_t(std::numeric_limits<int32_t>::max()) + 1, "token file '", source, "': id ",
                  word.substr(0, 24), word.size() > 24 ? "..." : "", " at byte ", i,
                  " is out of range (token ids are 32-bit, at most ", std::numeric_limits<int32_t>::max(), ")");
    }
    if (word[0] == '-') v = -v;
    SLOPE_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
                "token file '", source, "': id ", word, " at byte ", i,
                " is out of range (token ids are 32-bit, at most ", std::numeric_limits<int32_t>::max(), ")");
    out.push_back(int32_t(v));
    i = end;
  }
  return out;
}

std::vector<int32_t> read_token_file(const std::string& path) {
  return parse_token_ids(read_regular_file(path, "token file"), path);
}

}  // namespace slope::model
