// Seeded random prompt ids for the CLI (token files: model::read_token_file, model/token_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slope::cli {

// n ids uniform in [0, vocab), deterministic in seed.
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed);

}  // namespace slope::cli
