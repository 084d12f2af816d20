// Pre-tokenizers of tokenizer.json: Split (regex or string, every split behaviour, invert),
// ByteLevel, Metaspace, Digits and a Sequence of them. Each cuts the pieces of text left
// between added tokens into the words the model encodes one at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "slope/text/json_fields.h"

namespace slope::text {

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the input (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// Null json gives nullptr (the whole piece is one word). Unknown types throw slope::Error.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j);

// GPT-2's byte-to-character table: the printable character each byte stands for in a
// byte-level vocabulary, and the inverse (-1 for characters that are not in the table).
const std::string& byte_level_char(unsigned char b);
int byte_level_byte(char32_t c);

}  // namespace slope::text
