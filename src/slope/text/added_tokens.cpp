#include "slope/text/added_tokens.h"

#include <utf8proc.h>

#include "slope/text/unicode_proxy.h"
#include "slope/text/utf8.h"

namespace slope::text {
namespace {

// Rust's char::is_whitespace: the White_Space property.
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// A word character for single_word: alphanumeric or '_'.
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(unicode_proxy(c)));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

char32_t last_char(std::string_view s) {
  size_t b = s.size() - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_next(s, b);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::string> patterns, std::vector<const AddedToken*> tokens)
    : patterns_(std::move(patterns)), tokens_(std::move(tokens)) {
  trie_.emplace_back();
  for (size_t k = 0; k < patterns_.size(); ++k) {
    const std::string& p = patterns_[k];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char c : p) {
      int32_t child = -1;
      for (auto [ch, n] : trie_[size_t(node)].next)
        if (ch == c) child = n;
      if (child < 0) {
        child = int32_t(trie_.size());
        trie_[size_t(node)].next.emplace_back(c, child);
        trie_.emplace_back();
      }
      node = child;
    }
    if (trie_[size_t(node)].token < 0) trie_[size_t(node)].token = int32_t(k);
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t done = 0;  // text before this offset is already in `out`
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // The longest token starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      int32_t child = -1;
      for (auto [ch, n] : trie_[size_t(node)].next)
        if (ch == static_cast<unsigned char>(text[j])) child = n;
      if (child < 0) break;
      node = child;
      if (trie_[size_t(node)].token >= 0) best = trie_[size_t(node)].token, best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = *tokens_[size_t(best)];
    size_t begin = i, end = best_end;
    i = best_end;  // matches do not overlap, also when one is rejected below
    if (tok.single_word) {
      const bool space_before = begin == 0 || !is_word_char(last_char(text.substr(0, begin)));
      size_t k = end;
      const bool space_after = end == text.size() || !is_word_char(utf8_next(text, k));
      if (!space_before || !space_after) continue;
    }
    if (tok.lstrip) {
      size_t b = begin;
      while (b > done) {
        size_t c = b - 1;
        while (c > 0 && (static_cast<unsigned char>(text[c]) & 0xC0) == 0x80) --c;
        size_t k = c;
        if (!is_whitespace(utf8_next(text, k))) break;
        b = c;
      }
      begin = b;
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t k = end;
        if (!is_whitespace(utf8_next(text, k))) break;
        end = k;
      }
      i = std::max(i, end);
    }
    if (done < begin) out.push_back({done, begin, -1});
    out.push_back({begin, end, tok.id});
    done = end;
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

}  // namespace slope::text
