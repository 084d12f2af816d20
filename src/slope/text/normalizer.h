// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD, Prepend, Replace and a Sequence of them.
// Each rewrites one piece of input text (the text between added tokens) in place.
#pragma once

#include <memory>
#include <string>

#include "slope/text/json_fields.h"

namespace slope::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `at_origin`: whether the first character still maps to the first character of the input;
  // `tokenizers` ties a replacement to the last character it removes, so a Replace at offset 0
  // that shortens the text clears it (Metaspace's prepend_scheme "first" reads it).
  virtual void normalize(std::string& s, bool& at_origin) const = 0;
  void normalize(std::string& s) const {
    bool ignored = true;
    normalize(s, ignored);
  }
};

// Null json gives nullptr (no normalizer). Unknown types throw slope::Error naming the type.
std::unique_ptr<Normalizer> make_normalizer(const json& j);

}  // namespace slope::text
