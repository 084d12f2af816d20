// tokenizer.json (src/slope/text/tokenizer.h) and the text it encodes. The input is a 4-byte
// little-endian length L, L bytes of tokenizer.json, then the text; an input without a valid L
// is all tokenizer.json (and the text is empty). A tokenizer that loads encodes the text (with
// and without the special tokens), and the text as every chat format renders it; decodes the
// ids, and ids taken from the text's bytes. Beyond a crash or a non-slope::Error exception, a
// finding is an id outside the vocabulary or decoded text that is not valid UTF-8 (tokenizer.h
// promises both).
#include <cstring>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/text/chat.h"
#include "slope/text/tokenizer.h"
#include "slope/text/utf8.h"

namespace {

using slope::text::Tokenizer;

void check_ids(const Tokenizer& t, const std::vector<int32_t>& ids) {
  for (const int32_t id : ids)
    if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // encode gave an id outside the vocabulary
  for (const bool skip : {false, true})
    if (slope::text::utf8_invalid_offset(t.decode(ids, skip)) != std::string::npos) __builtin_trap();
}

void encode_and_decode(const Tokenizer& t, const std::string& text, bool add_special) {
  try {
    check_ids(t, t.encode(text, add_special));
  } catch (const slope::Error&) {  // invalid UTF-8, reported with its offset
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint32_t length = 0;
  if (size >= 4) std::memcpy(&length, data, 4);
  const bool split = size >= 4 && length <= size - 4;
  const std::string json = split ? std::string(reinterpret_cast<const char*>(data) + 4, length)
                                 : std::string(reinterpret_cast<const char*>(data), size);
  const std::string text = split ? std::string(reinterpret_cast<const char*>(data) + 4 + length, size - 4 - length) : "";
  try {
    const Tokenizer t = Tokenizer::from_json(json);
    encode_and_decode(t, text, true);
    encode_and_decode(t, text, false);
    for (const auto format : {slope::text::ChatFormat::Harmony, slope::text::ChatFormat::Llama3,
                              slope::text::ChatFormat::ChatML}) {
      try {
        const std::string prompt =
            slope::text::render_chat(format, {{"system", text}, {"user", text}, {"assistant", text}});
        encode_and_decode(t, prompt, false);
      } catch (const slope::Error&) {
      }
    }
    // Arbitrary ids: each 2 bytes of the text, around the vocabulary's size (some outside it,
    // which decode must refuse with a slope::Error).
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < text.size(); i += 2)
      ids.push_back(int32_t(int64_t(uint8_t(text[i]) | uint8_t(text[i + 1]) << 8) % (int64_t(t.vocab_size()) + 2) - 1));
    try {
      for (const bool skip : {false, true})
        if (slope::text::utf8_invalid_offset(t.decode(ids, skip)) != std::string::npos) __builtin_trap();
    } catch (const slope::Error&) {
    }
    (void)t.token_to_id(text);
  } catch (const slope::Error&) {
  }
  return 0;
}
