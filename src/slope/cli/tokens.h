// Prompt token ids for the CLI: from a file, or seeded random ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slope::cli {

// A text file of integer ids separated by whitespace or commas (a JSON array also parses):
// model::read_token_file (slope/model/token_file.h). Throws slope::Error naming the file and
// the offending text.
std::vector<int32_t> read_token_file(const std::string& path);
// n ids uniform in [0, vocab), deterministic in seed.
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed);

}  // namespace slope::cli
