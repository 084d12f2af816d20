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
  virtual void normalize(std::string& s) const = 0;
};

// Null json gives nullptr (no normalizer). Unknown types throw slope::Error naming the type.
std::unique_ptr<Normalizer> make_normalizer(const json& j);

}  // namespace slope::text
