// Prompt token ids from text: integers separated by whitespace or commas (a JSON array of
// integers also parses). Kept apart from the CLI so the parser can be tested and fuzzed alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slope::model {

// Parses `text`; throws slope::Error naming `source`, the byte offset and the offending text
// for anything that is not a list of 32-bit integers ("3-4", "1.5", "12abc", an id with more
// digits than fit). Range checks against a vocabulary are validate_token_ids' (model.h).
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source);

// parse_token_ids of the regular file `path` (a directory or FIFO is refused by name).
std::vector<int32_t> read_token_file(const std::string& path);

}  // namespace slope::model
