// MoE building blocks against brute-force and double-precision references.
//
// Tolerances: routing ids exact; routing weights 1e-6 absolute (softmax of ≤ k values in
// [0, 1]); activations 2e-6 relative + 1e-7 absolute (vectorised exp is within a few ulp);
// gather exact; scatter-add 1e-6 relative to Σ|terms|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/kernels/moe.h"
#include "../bf16_reference.h"

namespace slope::kernels {
namespace {

constexpr double kWeightTol = 1e-6;
constexpr double kActRel = 2e-6, kActAbs = 1e-7;

using slope::testing::bf16_reference;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void check_routing(const std::vector<float>& logits, int64_t n, int64_t E, int k) {
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  for (int64_t t = 0; t < n; ++t) {
    // Brute force: sort all experts by (logit descending, index ascending).
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    const float* l = logits.data() + t * E;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    double m = l[order[0]], sum = 0;
    for (int j = 0; j < k; ++j) sum += std::exp(double(l[order[j]]) - m);
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(ids[t * k + j], order[j]) << "token " << t << " choice " << j;
      ASSERT_NEAR(w[t * k + j], std::exp(double(l[order[j]]) - m) / sum, kWeightTol);
    }
  }
}

TEST(MoeRoute, TopKSoftmaxMatchesBruteForce) {
  for (auto [n, E, k] : {std::tuple<int64_t, int64_t, int>{1, 1, 1}, {3, 8, 2}, {17, 32, 4},
                         {130, 128, 4}, {5, 33, 33}}) {
    check_routing(random_floats(n * E, uint32_t(n * E), -4.f, 4.f), n, E, k);
    // Many ties: integer logits in a small range; lower index must come first.
    std::vector<float> tied(n * E);
    std::mt19937 rng{uint32_t(E)};
    for (auto& v : tied) v = float(int(rng() % 3));
    check_routing(tied, n, E, k);
  }
}

TEST(MoeRoute, RejectsBadK) {
  std::vector<float> l(8);
  std::vector<int32_t> ids(16);
  std::vector<float> w(16);
  EXPECT_THROW(route_topk_softmax(l.data(), 1, 8, 9, ids.data(), w.data()), slope::Error);
  EXPECT_THROW(route_topk_softmax(l.data(), 1, 8, 0, ids.data(), w.data()), slope::Error);
}

TEST(MoeGroup, RoundTrip) {
  const int64_t n = 130, E = 33, dim = 47;
  const int k = 4;
  const auto logits = random_floats(n * E, 3, -2.f, 2.f);
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  const ExpertGroups g = group_by_expert(ids.data(), w.data(), n, k, E);

  ASSERT_EQ(g.offsets.size(), size_t(E + 1));
  EXPECT_EQ(g.offsets[0], 0);
  EXPECT_EQ(g.offsets[E], n * k);
  std::vector<int> seen(n * k, 0);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = g.offsets[e]; r < g.offsets[e + 1]; ++r) {
      if (r > g.offsets[e]) {
        EXPECT_LT(g.token[r - 1], g.token[r]) << "not stable by token";
      }
      // Find the slot of this (token, expert): each token picks an expert at most once.
      const int64_t t = g.token[r];
      int found = -1;
      for (int j = 0; j < k; ++j)
        if (ids[t * k + j] == e) found = j;
      ASSERT_GE(found, 0) << "row " << r << " token " << t << " did not choose expert " << e;
      EXPECT_EQ(g.weight[r], w[t * k + found]);
      ++seen[t * k + found];
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);

  // gather -> scatter_add with the routing weights gives Σ_j w_j · x_t = x_t (weights sum to 1).
  const auto x = random_floats(n * dim, 4, -1.f, 1.f);
  std::vector<float> grouped(n * k * dim), y(n * dim, 0.f);
  gather_rows(x.data(), g.token.data(), n * k, dim, grouped.data());
  for (int64_t r = 0; r < n * k; ++r)
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_EQ(grouped[r * dim + i], x[g.token[r] * dim + i]);
  scatter_add_rows(grouped.data(), g.token.data(), g.weight.data(), n * k, dim, y.data());
  for (int64_t i = 0; i < n * dim; ++i) ASSERT_NEAR(y[i], x[i], 1e-6 * (std::abs(x[i]) + 1e-3));
}

// Rows chosen with repeats and out of order, odd widths (vector body and tails of 32).
TEST(MoeGroup, GatherRowsBf16RoundsEachElementToNearestEven) {
  for (int64_t dim : {1, 17, 31, 32, 33, 1031}) {
    const int64_t n = 9, m = 13;
    auto src = random_floats(n * dim, uint32_t(dim), -3.f, 3.f);
    src[0] = 1.0f + 1.0f / 256;  // halfway between bf16 1 and 1 + 2^-7: the tie goes to even 1
    std::vector<int64_t> rows(m);
    for (int64_t r = 0; r < m; ++r) rows[r] = (r * 5 + 3) % n;
    rows[2] = 0;
    std::vector<uint16_t> dst(m * dim);
    gather_rows_bf16(src.data(), rows.data(), m, dim, dst.data());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < dim; ++j)
        ASSERT_EQ(bf16_to_f32(dst[r * dim + j]), bf16_reference(src[rows[r] * dim + j]))
            << "dim=" << dim << " r=" << r << " j=" << j;
    EXPECT_EQ(bf16_to_f32(dst[2 * dim]), 1.0f);
  }
}

TEST(MoeGroup, ScatterAddWithRepeatsAndWideRows) {
  const int64_t m = 300, dim = 1031, ndst = 7;
  const auto src = random_floats(m * dim, 5, -1.f, 1.f);
  const auto w = random_floats(m, 6, -2.f, 2.f);
  std::vector<int64_t> rows(m);
  for (int64_t r = 0; r < m; ++r) rows[r] = (r * 5) % ndst;
  auto dst = random_floats(ndst * dim, 7, -1.f, 1.f);
  std::vector<double> ref(dst.begin(), dst.end()), mag(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) mag[i] = std::abs(ref[i]);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      ref[rows[r] * dim + i] += double(w[r]) * src[r * dim + i];
      mag[rows[r] * dim + i] += std::abs(double(w[r]) * src[r * dim + i]);
    }
  scatter_add_rows(src.data(), rows.data(), w.data(), m, dim, dst.data());
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_NEAR(dst[i], ref[i], 1e-6 * mag[i]);
}

// combine_rows: the sums of scatter_add_rows bit for bit (rows of a token in ascending order),
// over grouped rows of odd width with destinations repeated up to k times, one never hit, and
// dst non-zero; a negative destination is refused.
TEST(MoeGroup, CombineRowsEqualsScatterAdd) {
  const int64_t n = 37, E = 6, dim = 1031;
  const int k = 3;
  std::mt19937 rng(11);
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<float> weights(size_t(n * k));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    for (int j = 0; j < k; ++j) {
      ids[t * k + j] = e[j];
      weights[t * k + j] = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
    }
  }
  ExpertGroups g = group_by_expert(ids.data(), weights.data(), n, k, E);
  for (auto& t : g.token) t = t == 5 ? 6 : t;  // row 5 of dst gets nothing, row 6 twice k
  const int64_t m = n * k;
  const auto src = random_floats(m * dim, 12, -2.f, 2.f);
  const auto dst0 = random_floats(n * dim, 13, -1.f, 1.f);
  std::vector<float> want = dst0, got = dst0;
  for (int64_t e = 0; e < E; ++e) {  // per expert, as the composed MoE path adds
    const int64_t r0 = g.offsets[e];
    scatter_add_rows(src.data() + r0 * dim, g.token.data() + r0, g.weight.data() + r0, g.offsets[e + 1] - r0, dim,
                     want.data());
  }
  combine_rows(src.data(), g.token.data(), g.weight.data(), m, dim, got.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "i=" << i;
  for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(got[5 * dim + i], dst0[5 * dim + i]);

  std::vector<int64_t> bad = g.token;
  bad[4] = -1;
  EXPECT_THROW(combine_rows(src.data(), bad.data(), g.weight.data(), m, dim, got.data()), slope::Error);
}

TEST(MoeGroup, RejectsBadExpertId) {
  const int32_t ids[2] = {0, 5};
  const float w[2] = {0.5f, 0.5f};
  EXPECT_THROW(group_by_expert(ids, w, 1, 2, 4), slope::Error);
}

// The gpt-oss formula (gpt-oss-model.md §2), in double:
//   gate, up = gu[..., ::2], gu[..., 1::2]
//   gate = gate.clamp(max=limit); up = up.clamp(-limit, limit)
//   out = (up + 1) · gate · sigmoid(alpha · gate)
TEST(MoeActivation, SwigluOaiMatchesFormula) {
  const float alpha = 1.702f, limit = 7.0f;
  // Gates to -200 as well: alpha · gate past the range of the kernels' e^x clamp (-87.3 to 88.3
  // on AVX2), where sigmoid is about 0.
  for (float lo : {-20.f, -200.f})
  for (int64_t I : {1, 15, 16, 17, 33, 2883})
    for (int64_t m : {1, 3, 17}) {
      const auto gu = random_floats(m * 2 * I, uint32_t(I * 3 + m), lo, 20.f);
      std::vector<float> out(m * I);
      swiglu_oai(gu.data(), m, I, alpha, limit, out.data());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < I; ++i) {
          const double gate = std::min(double(gu[r * 2 * I + 2 * i]), double(limit));
          const double up = std::clamp(double(gu[r * 2 * I + 2 * i + 1]), -double(limit), double(limit));
          const double want = (up + 1.0) * gate / (1.0 + std::exp(-double(alpha) * gate));
          ASSERT_NEAR(out[r * I + i], want, kActRel * std::abs(want) + kActAbs)
              << "I=" << I << " m=" << m << " r=" << r << " i=" << i << " gate=" << gate
              << " up=" << up;
        }
    }
}

// The bf16 form is the f32 form rounded to nearest even, element for element (I across the
// 256-column blocks and the 16-lane tails), so it also meets the double formula within bf16's
// unit roundoff 2^-8 on top of the f32 tolerance.
TEST(MoeActivation, SwigluOaiBf16IsTheRoundedF32Form) {
  const float alpha = 1.702f, limit = 7.0f;
  for (int64_t I : {1, 15, 16, 17, 255, 256, 257, 600})
    for (int64_t m : {1, 3, 17}) {
      const auto gu = random_floats(m * 2 * I, uint32_t(I * 7 + m), -20.f, 20.f);
      std::vector<float> f32(m * I);
      std::vector<uint16_t> b(m * I);
      swiglu_oai(gu.data(), m, I, alpha, limit, f32.data());
      swiglu_oai_bf16(gu.data(), m, I, alpha, limit, b.data());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < I; ++i) {
          const float got = bf16_to_f32(b[r * I + i]);
          ASSERT_EQ(got, bf16_reference(f32[r * I + i])) << "I=" << I << " m=" << m << " r=" << r
                                                            << " i=" << i;
          const double gate = std::min(double(gu[r * 2 * I + 2 * i]), double(limit));
          const double up = std::clamp(double(gu[r * 2 * I + 2 * i + 1]), -double(limit), double(limit));
          const double want = (up + 1.0) * gate / (1.0 + std::exp(-double(alpha) * gate));
          ASSERT_NEAR(got, want, (kActRel + std::ldexp(1.0, -8)) * std::abs(want) + kActAbs)
              << "I=" << I << " m=" << m << " r=" << r << " i=" << i;
        }
    }
}

TEST(MoeActivation, SwigluOaiClampsAndInterleaving) {
  // One row, I = 3: (gate, up) pairs exercise each clamp; the +1 goes on up.
  const float gu[6] = {10.f, -10.f,   // gate clamped to 7, up clamped to −7
                       -3.f, 0.f,     // gate not clamped from below, up + 1 = 1
                       0.f, 100.f};   // gate 0 → 0 whatever up
  float out[3];
  swiglu_oai(gu, 1, 3, 1.702f, 7.0f, out);
  EXPECT_NEAR(out[0], (-7.0 + 1.0) * 7.0 / (1.0 + std::exp(-1.702 * 7.0)), 1e-5);
  EXPECT_NEAR(out[1], 1.0 * -3.0 / (1.0 + std::exp(1.702 * 3.0)), 1e-6);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(MoeActivation, SiluMulMatchesFormula) {
  for (int64_t I : {1, 16, 17, 33, 1031})
    for (int64_t m : {1, 3, 17}) {
      const auto gu = random_floats(m * 2 * I, uint32_t(I + m), -120.f, 30.f);
      std::vector<float> out(m * I);
      silu_mul(gu.data(), m, I, out.data());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < I; ++i) {
          const double g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
          const double want = g / (1.0 + std::exp(-g)) * u;
          ASSERT_NEAR(out[r * I + i], want, kActRel * std::abs(want) + kActAbs)
              << "I=" << I << " m=" << m << " i=" << i;
        }
    }
}

}  // namespace
}  // namespace slope::kernels
