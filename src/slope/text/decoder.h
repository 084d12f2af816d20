// Decoders of tokenizer.json: ByteLevel, ByteFallback, Metaspace, Strip, Fuse, Replace and a
// Sequence of them. Each rewrites the list of token strings; the text is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "slope/text/json_fields.h"

namespace slope::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Null json gives nullptr (tokens are joined with spaces). Unknown types throw slope::Error.
std::unique_ptr<Decoder> make_decoder(const json& j);

}  // namespace slope::text
