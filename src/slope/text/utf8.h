// UTF-8 helpers for the tokenizer: validation with the offset of the first bad byte, code point
// stepping, and the lossy conversion decoders use (each maximal invalid subpart becomes U+FFFD,
// the Unicode-recommended practice, which is what Rust's String::from_utf8_lossy does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slope::text {

// Length of the valid UTF-8 sequence at s[i], or 0 when it is invalid; `bad` then receives the
// length of the maximal invalid subpart (1 to 3 bytes) that one U+FFFD replaces.
size_t utf8_sequence_length(std::string_view s, size_t i, size_t* bad = nullptr);
// Offset of the first byte that is not part of valid UTF-8, or npos when all of s is valid.
size_t utf8_invalid_offset(std::string_view s);
// Decodes the (valid) code point at s[i] and advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);
// s with every maximal invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view s);

}  // namespace slope::text
