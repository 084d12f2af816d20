// A Hugging Face tokenizer.json, loaded and run in C++ with the ids `tokenizers` gives.
//
// encode: added tokens are cut out of the raw text first (those with normalized=false), each
// remaining piece is normalized and cut at the normalized added tokens, then pre-tokenized into
// words that the BPE model encodes; the post-processor adds BOS and the like when add_special.
// decode: ids to token strings (skipping special tokens when asked), then the decoder chain.
//
// Input text must be valid UTF-8 (a Python str, which `tokenizers` takes, cannot hold anything
// else): encode rejects invalid bytes with a slope::Error naming the byte offset. Decoded text
// is always valid UTF-8: bytes that do not form a character become U+FFFD, as `tokenizers` does.
// Every component or option this code does not implement is a slope::Error naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace slope::text {

class Normalizer;
class PreTokenizer;
class Bpe;
class Decoder;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class Tokenizer {
 public:
  // Throws slope::Error naming the file and the problem.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const std::string& text);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // The string of one id (added token or vocab entry); throws slope::Error for unknown ids.
  const std::string& id_to_token(int32_t id) const;
  // -1 when absent.
  int32_t token_to_id(std::string_view token) const;
  // One more than the largest id of the vocab and the added tokens.
  int32_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slope::text
