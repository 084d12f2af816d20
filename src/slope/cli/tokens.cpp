#include "slope/cli/tokens.h"

#include <random>

#include "slope/core/error.h"

namespace slope::cli {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  SLOPE_CHECK(n > 0, "--random-tokens must be positive, got ", n);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> out(n);
  for (auto& t : out) t = dist(rng);
  return out;
}

}  // namespace slope::cli
