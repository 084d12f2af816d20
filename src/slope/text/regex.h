// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available) for the Split
// pre-tokenizer and the Replace normalizer/decoder. Patterns are used as tokenizer.json writes
// them (\p{L}, possessive quantifiers, lookaheads); none is rewritten.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace slope::text {

class Regex {
 public:
  // Throws slope::Error naming the pattern, the offset and PCRE2's message when it does not compile.
  explicit Regex(const std::string& pattern);
  // Every match, left to right, as byte ranges [begin, end) of the (valid UTF-8) subject. After an
  // empty match the search resumes one character later, as Oniguruma's iterator (which
  // `tokenizers` uses) does.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace slope::text
