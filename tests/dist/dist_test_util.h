// Helpers shared by the MPI attention tests: seeded random data and picking a shard's rows out
// of a whole-sequence tensor (every rank builds the same full tensors from the same seed, so
// each can compare its own rows with the single-rank reference).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "slope/ops/attention_runner.h"

namespace slope::dist_test {

constexpr double kTolerance = 1e-4;  // f32 relative error against the single-rank result

inline std::vector<float> random_vec(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = d(rng);
  return out;
}

// Rows of `full` [N, row_elems] at the shard's positions, in buffer order.
inline std::vector<float> gather_rows(const std::vector<float>& full,
                                      const ops::SequenceShard& shard, int64_t row_elems) {
  std::vector<float> out;
  out.reserve(size_t(shard.local_tokens() * row_elems));
  for (int64_t p : shard.positions())
    out.insert(out.end(), full.begin() + p * row_elems, full.begin() + (p + 1) * row_elems);
  return out;
}

}  // namespace slope::dist_test
