// Finding added tokens in text as `tokenizers` does: leftmost-longest matches of the token
// strings, skipping a match that is not a whole word when single_word is set, and taking the
// whitespace before (lstrip) or after (rstrip) a match into it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slope/text/tokenizer.h"

namespace slope::text {

class AddedTokenMatcher {
 public:
  // `patterns[k]` is the text to find for `tokens[k]` (its content, or its normalized content).
  AddedTokenMatcher(std::vector<std::string> patterns, std::vector<const AddedToken*> tokens);
  bool empty() const { return patterns_.empty(); }

  struct Segment {
    size_t begin, end;
    int32_t id;  // -1: plain text to encode
  };
  // The text cut into plain segments and added-token segments, in order, none empty.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;  // index into patterns_ of the token ending here
  };
  std::vector<std::string> patterns_;
  std::vector<const AddedToken*> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
};

}  // namespace slope::text
