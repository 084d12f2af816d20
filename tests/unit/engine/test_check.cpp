// `slope run --check`'s comparison (engine/check.h): a mesh's logits, first token and K/V
// against one rank's. The counts of rows past the tolerance and the verdicts are worked out by
// hand for errors planted in copies of a reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/check.h"

using namespace slope;

namespace {

// A reference of `layers` layers of [rows, 2, 4] K and V, every element 1 (the norm is 1), 16
// logits, and an exact copy of it.
struct Pair {
  std::vector<float> logits, one_logits;
  std::vector<Tensor> k, v, one_k, one_v;
};

Pair make(int64_t rows, int layers) {
  Pair p;
  p.one_logits.assign(16, 1.f);
  p.logits = p.one_logits;
  for (int l = 0; l < layers; ++l)
    for (auto* pair : {&p.k, &p.one_k, &p.v, &p.one_v}) {
      Tensor t({rows, 2, 4}, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 1.f;
      pair->push_back(std::move(t));
    }
  return p;
}

// Adds `err` to one element of rows [0, n) of the mesh's K (or V) of `layer`.
void plant(std::vector<Tensor>& kv, int layer, int64_t n, float err) {
  for (int64_t r = 0; r < n; ++r) kv[layer].data<float>()[r * 8 + 3] += err;
}

engine::CheckResult compare(const Pair& p, kernels::ComputeType ct, int32_t first = 7, int32_t one_first = 7) {
  return engine::compare_with_one_rank(p.logits, first, p.k, p.v, p.one_logits, one_first, p.one_k, p.one_v,
                                       engine::check_tolerance(ct));
}

constexpr auto kBf16 = kernels::ComputeType::BF16;
constexpr auto kF32 = kernels::ComputeType::F32;

TEST(RunCheck, EqualPasses) {
  const engine::CheckResult c = compare(make(96, 3), kBf16);
  EXPECT_TRUE(c.pass);
  EXPECT_EQ(c.kv_rows_over, 0);
  EXPECT_EQ(c.kv_rows_allowed, 1);  // 1% of 96 rounds to 0: at least 1
  EXPECT_TRUE(compare(make(96, 3), kF32).pass);
}

TEST(RunCheck, Bf16AllowsOnePercentOfALayersRows) {
  // 300 rows: 3 may be past the KV tolerance (0.15) in any one layer.
  Pair p = make(300, 3);
  plant(p.k, 1, 3, 0.3f);
  engine::CheckResult c = compare(p, kBf16);
  EXPECT_EQ(c.kv_rows_allowed, 3);
  EXPECT_EQ(c.kv_rows_over, 3);
  EXPECT_NEAR(c.kv_rel_err, 0.3, 1e-6);
  EXPECT_TRUE(c.pass);
  // Three more in another layer, or in V of the same one: still 3 in the worst layer's K or V.
  plant(p.v, 1, 3, 0.3f);
  plant(p.k, 2, 3, 0.3f);
  EXPECT_TRUE(compare(p, kBf16).pass);
  // A fourth row in one layer: too many.
  p.k[1].data<float>()[3 * 8 + 5] += 0.2f;
  c = compare(p, kBf16);
  EXPECT_EQ(c.kv_rows_over, 4);
  EXPECT_FALSE(c.pass);
}

TEST(RunCheck, Bf16ManyRowsOffFails) {
  // Every row off by a little more than the tolerance: a wrong kernel, not a router tie.
  Pair p = make(96, 2);
  plant(p.v, 0, 96, 0.16f);
  const engine::CheckResult c = compare(p, kBf16);
  EXPECT_EQ(c.kv_rows_over, 96);
  EXPECT_FALSE(c.pass);
  // Under the tolerance everywhere: passes.
  Pair q = make(96, 2);
  plant(q.v, 0, 96, 0.14f);
  EXPECT_TRUE(compare(q, kBf16).pass);
}

TEST(RunCheck, F32AllowsNoRow) {
  Pair p = make(300, 2);
  plant(p.k, 0, 1, 2e-4f);
  const engine::CheckResult c = compare(p, kF32);
  EXPECT_EQ(c.kv_rows_allowed, 0);
  EXPECT_EQ(c.kv_rows_over, 1);
  EXPECT_FALSE(c.pass);
}

TEST(RunCheck, LogitsAndFirstToken) {
  Pair p = make(96, 1);
  p.logits[5] += 0.04f;  // past bf16's 3e-2, relative to the norm 1
  EXPECT_NEAR(compare(p, kBf16).logits_rel_err, 0.04, 1e-6);
  EXPECT_FALSE(compare(p, kBf16).pass);
  Pair q = make(96, 1);
  const engine::CheckResult c = compare(q, kBf16, 7, 8);
  EXPECT_FALSE(c.same_first_token);
  EXPECT_FALSE(c.pass);
}

TEST(RunCheck, ShapeMismatchThrows) {
  Pair p = make(96, 1);
  p.one_logits.push_back(0.f);
  EXPECT_THROW(compare(p, kBf16), Error);
  Pair q = make(96, 1);
  q.k[0] = Tensor({95, 2, 4}, DType::F32);
  EXPECT_THROW(compare(q, kBf16), Error);
}

}  // namespace
