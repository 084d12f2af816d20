// Mesh validation, zigzag sharding, halo and head bookkeeping: pure functions, no MPI.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "slope/core/error.h"
#include "slope/parallel/halo_exchange.h"
#include "slope/parallel/mesh.h"
#include "slope/parallel/shard.h"
#include "slope/parallel/ulysses.h"

using namespace slope;
using namespace slope::parallel;

namespace {

std::string error_of(const MeshShape& s, int world, int64_t hq, int64_t hkv, int64_t n) {
  try {
    validate_mesh(s, world, hq, hkv, n);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ValidateMesh, AcceptsFittingShapes) {
  EXPECT_NO_THROW(validate_mesh({.ring = 4, .ulysses = 1}, 4, 64, 8, 100));
  EXPECT_NO_THROW(validate_mesh({.ring = 2, .ulysses = 8}, 16, 64, 8, 100));
  EXPECT_NO_THROW(validate_mesh({.ring = 1, .ulysses = 16}, 16, 64, 8, 100));  // KV replicated
  EXPECT_NO_THROW(validate_mesh({.ring = 4, .ulysses = 2}, 8, 64, 8, 3));  // ranks without tokens
}

TEST(ValidateMesh, RankCountNamesTheFittingShapes) {
  EXPECT_EQ(error_of({.ring = 2, .ulysses = 3}, 4, 64, 8, 100),
            "--ulysses 3 --ring 2 needs 6 ranks, got 4; with 4 ranks use (U,R) in "
            "{(1,4), (2,2), (4,1)}");
  // Heads restrict the list: 6 ranks, 8 heads -> U in {1, 2}.
  EXPECT_EQ(error_of({.ring = 1, .ulysses = 1}, 6, 8, 8, 100),
            "--ulysses 1 --ring 1 needs 1 ranks, got 6; with 6 ranks use (U,R) in {(1,6), (2,3)}");
}

TEST(ValidateMesh, UlyssesMustDivideHeads) {
  const std::string e = error_of({.ring = 1, .ulysses = 3}, 3, 64, 8, 100);
  EXPECT_NE(e.find("--ulysses 3 does not divide num_attention_heads 64"), std::string::npos) << e;
  EXPECT_NE(e.find("valid --ulysses: 1, 2, 4, 8, 16, 32, 64"), std::string::npos) << e;
}

TEST(ValidateMesh, UlyssesMustNestWithKvHeads) {
  // 12 query heads, 3 KV heads: U = 2 or 4 would give a rank part of a KV group's heads.
  const std::string e = error_of({.ring = 1, .ulysses = 2}, 2, 12, 3, 100);
  EXPECT_NE(e.find("num_key_value_heads 3"), std::string::npos) << e;
  EXPECT_NE(e.find("valid --ulysses: 1, 3, 6, 12"), std::string::npos) << e;
}

TEST(ValidateMesh, RejectsEmptyPromptAndBadDegrees) {
  EXPECT_NE(error_of({.ring = 2, .ulysses = 1}, 2, 8, 8, 0).find("0 tokens"), std::string::npos);
  EXPECT_NE(error_of({.ring = 0, .ulysses = 1}, 1, 8, 8, 5).find("at least 1"), std::string::npos);
}

TEST(Zigzag, RingRankHoldsChunksIAnd2RMinus1MinusI) {
  ZigzagLayout lay(80, {.ring = 4, .ulysses = 1});
  for (int c = 0; c < 8; ++c) EXPECT_EQ(lay.chunk(c).start, c * 10);
  for (int r = 0; r < 3; ++r) {
    const SequenceShard s = lay.shard(r, 0);
    ASSERT_EQ(s.segments.size(), 2u);
    EXPECT_EQ(s.segments[0].start, r * 10);
    EXPECT_EQ(s.segments[1].start, (7 - r) * 10);
  }
  // The last ring rank's chunks R-1 and R touch: one segment.
  const SequenceShard last = lay.shard(3, 0);
  ASSERT_EQ(last.segments.size(), 1u);
  EXPECT_EQ(last.segments[0].start, 30);
  EXPECT_EQ(last.segments[0].length, 20);
  // R = 1: one contiguous segment, split evenly by Ulysses.
  ZigzagLayout one(10, {.ring = 1, .ulysses = 4});
  EXPECT_EQ(one.shard(0, 0).segments.size(), 1u);
  EXPECT_EQ(one.shard(0, 1).segments[0].start, 2);
  EXPECT_EQ(one.shard(0, 1).segments[0].length, 3);
}

TEST(Zigzag, EveryTokenHeldOnceAndSizesDifferByAtMostOnePerChunk) {
  for (int R : {1, 2, 3, 4, 8})
    for (int U : {1, 2, 3, 4})
      for (int64_t n : {1, 2, 5, 7, 16, 17, 63, 100, 1001}) {
        ZigzagLayout lay(n, {.ring = R, .ulysses = U});
        std::vector<int> count(size_t(n), 0);
        for (const SequenceShard& s : lay.all_shards()) {
          EXPECT_EQ(s.total_tokens, n);
          for (int64_t p : s.positions()) ++count[size_t(p)];
        }
        for (int64_t p = 0; p < n; ++p) ASSERT_EQ(count[size_t(p)], 1) << n << " R" << R << " U" << U;
        for (int c = 0; c < 2 * R; ++c) {
          EXPECT_GE(lay.chunk(c).length, n / (2 * R));
          EXPECT_LE(lay.chunk(c).length, n / (2 * R) + 1);
        }
        // Group order after the all-to-all is ring-shard order.
        for (int r = 0; r < R; ++r) {
          int64_t rows = 0;
          for (int u = 0; u < U; ++u) rows += lay.shard(r, u).local_tokens();
          EXPECT_EQ(rows, lay.ring_shard(r).local_tokens());
        }
      }
}

TEST(Zigzag, BalancesCausalWork) {
  // Causal work of a shard ∝ Σ (position + 1); zigzag keeps ranks within a few percent.
  const int64_t n = 4096;
  ZigzagLayout lay(n, {.ring = 4, .ulysses = 1});
  std::vector<double> work;
  for (int r = 0; r < 4; ++r) {
    double w = 0;
    for (int64_t p : lay.shard(r, 0).positions()) w += double(p + 1);
    work.push_back(w);
  }
  const auto [lo, hi] = std::minmax_element(work.begin(), work.end());
  EXPECT_LT(*hi / *lo, 1.01);
}

TEST(Halo, NeedsOnlyTheWindowBeforeEachSegmentMinusOwnRows) {
  SequenceShard s{100, {{10, 5}, {40, 20}}};
  const std::vector<Segment> need = halo_needed(s, 8);  // 7 rows before each segment
  ASSERT_EQ(need.size(), 2u);
  EXPECT_EQ(need[0].start, 3);
  EXPECT_EQ(need[0].length, 7);
  EXPECT_EQ(need[1].start, 33);
  EXPECT_EQ(need[1].length, 7);
  // Windows reaching into the own first segment, and past the start of the sequence.
  SequenceShard t{100, {{2, 3}, {8, 4}}};
  const std::vector<Segment> need2 = halo_needed(t, 10);
  ASSERT_EQ(need2.size(), 2u);
  EXPECT_EQ(need2[0].start, 0);
  EXPECT_EQ(need2[0].length, 2);
  EXPECT_EQ(need2[1].start, 5);
  EXPECT_EQ(need2[1].length, 3);
}

TEST(UlyssesHeads, ReceivesExactlyTheKvHeadsItsQueryHeadsRead) {
  // 64 q / 8 kv heads, U = 4: 16 q heads, 2 kv heads each.
  HeadSlice h = ulysses_heads(1, 4, 64, 8);
  EXPECT_EQ(h.q0, 16);
  EXPECT_EQ(h.nq, 16);
  EXPECT_EQ(h.kv0, 2);
  EXPECT_EQ(h.nkv, 2);
  // U = 16 > 8 kv heads: 4 q heads, one kv head shared by two ranks.
  for (int u = 0; u < 16; ++u) {
    h = ulysses_heads(u, 16, 64, 8);
    EXPECT_EQ(h.nq, 4);
    EXPECT_EQ(h.nkv, 1);
    EXPECT_EQ(h.kv0, u / 2);
  }
  EXPECT_EQ(valid_ulysses_degrees(64, 8), (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
}
