// RoPE: inv_freq for default / llama3 / yarn against values derived by hand in this file from
// the published formulas, and the rotation against a naive double-precision reference.
//
// Tolerances: inv_freq and attention_scaling are computed in double, so they must match the
// test's own double formulas to 1e-12 relative; against the 5-7 digit hand-derived constants
// (gpt-oss low/high/mscale) to their printed precision. Rotated f32 outputs: 2e-6 · |x| scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "slope/core/error.h"
#include "slope/kernels/rope.h"

namespace slope::kernels {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kFormulaRel = 1e-12;
constexpr double kApplyTol = 2e-6;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_rel(double got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::abs(got - want), rel * std::abs(want)) << what << ": got " << got << " want " << want;
}

RopeConfig gpt_oss_config() {
  RopeConfig c;
  c.type = "yarn";
  c.theta = 150000.0;
  c.head_dim = 64;
  c.factor = 32.0;
  c.beta_fast = 32.0;
  c.beta_slow = 1.0;
  c.original_max_position_embeddings = 4096;
  c.truncate = false;
  return c;
}

TEST(Rope, DefaultInvFreq) {
  RopeConfig c;
  c.theta = 10000.0;
  c.head_dim = 128;
  const Rope r(c);
  ASSERT_EQ(r.inv_freq().size(), 64u);
  EXPECT_EQ(r.attention_scaling(), 1.0);
  for (int i = 0; i < 64; ++i)
    expect_rel(r.inv_freq()[i], std::exp(-(2.0 * i / 128.0) * std::log(10000.0)), kFormulaRel,
               "inv_freq[" + std::to_string(i) + "]");
  EXPECT_EQ(r.inv_freq()[0], 1.0);
}

// gpt-oss: θ = 150000, d = 64, factor 32, β = 32/1, L = 4096, truncate = false.
//   low  = 64·ln(4096/(32·2π)) / (2·ln 150000) = 8.09278
//   high = 64·ln(4096/(1·2π))  / (2·ln 150000) = 17.39802
//   mscale = 0.1·ln 32 + 1 = 1.3465736
TEST(Rope, YarnGptOss) {
  const Rope r(gpt_oss_config());
  ASSERT_EQ(r.inv_freq().size(), 32u);
  EXPECT_NEAR(r.attention_scaling(), 1.3465736, 5e-8);

  const double low = 8.09278, high = 17.39802;  // hand-derived, 5 decimals
  for (int i = 0; i < 32; ++i) {
    const double pos_freq = std::pow(150000.0, 2.0 * i / 64.0);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = 1.0 / (32.0 * pos_freq) * ramp + 1.0 / pos_freq * (1.0 - ramp);
    // 5-decimal low/high move the ramp by < 1e-6, i.e. inv_freq by < 2e-5 relative near the
    // top of the ramp where the extrapolated part is small; exact checks follow below.
    expect_rel(r.inv_freq()[i], want, 2e-5, "gpt-oss inv_freq[" + std::to_string(i) + "]");
  }
  // Outside the ramp: pure extrapolation (i <= 8) and pure interpolation (i >= 18).
  expect_rel(r.inv_freq()[8], std::pow(150000.0, -16.0 / 64.0), kFormulaRel, "i=8");
  expect_rel(r.inv_freq()[18], std::pow(150000.0, -36.0 / 64.0) / 32.0, kFormulaRel, "i=18");
  // Inside the ramp, i = 9: ramp = (9 − low)/(high − low) computed in full precision.
  const double lo = 64.0 * std::log(4096.0 / (32.0 * 2 * kPi)) / (2 * std::log(150000.0));
  const double hi = 64.0 * std::log(4096.0 / (1.0 * 2 * kPi)) / (2 * std::log(150000.0));
  EXPECT_NEAR(lo, low, 5e-6);
  EXPECT_NEAR(hi, high, 5e-6);
  const double ramp9 = (9 - lo) / (hi - lo), f9 = std::pow(150000.0, -18.0 / 64.0);
  expect_rel(r.inv_freq()[9], f9 / 32.0 * ramp9 + f9 * (1 - ramp9), kFormulaRel, "i=9");
}

TEST(Rope, YarnTruncateFloorsAndCeils) {
  RopeConfig c = gpt_oss_config();
  c.truncate = true;  // low = 8, high = 18
  const Rope r(c);
  for (int i = 0; i < 32; ++i) {
    const double f = std::pow(150000.0, -2.0 * i / 64.0);
    const double ramp = std::clamp((i - 8.0) / 10.0, 0.0, 1.0);
    expect_rel(r.inv_freq()[i], f / 32.0 * ramp + f * (1 - ramp), kFormulaRel,
               "truncated inv_freq[" + std::to_string(i) + "]");
  }
}

TEST(Rope, YarnAttentionFactorVariants) {
  RopeConfig c = gpt_oss_config();
  c.attention_factor = 0.7;
  EXPECT_EQ(Rope(c).attention_scaling(), 0.7);
  c.attention_factor = 0.0;
  c.mscale = 1.0;
  c.mscale_all_dim = 1.0;  // DeepSeek-V3 style: ratio of equal mscales is 1
  EXPECT_NEAR(Rope(c).attention_scaling(), 1.0, 1e-15);
  c.mscale = 0.707;
  c.mscale_all_dim = 0.5;
  EXPECT_NEAR(Rope(c).attention_scaling(),
              (0.1 * 0.707 * std::log(32.0) + 1) / (0.1 * 0.5 * std::log(32.0) + 1), 1e-14);
  c.mscale = c.mscale_all_dim = 0;
  c.factor = 1.0;  // no interpolation: get_mscale(1) = 1
  EXPECT_EQ(Rope(c).attention_scaling(), 1.0);
}

// Llama-3.1: θ = 5e5, d = 128, factor 8, low_freq_factor 1, high_freq_factor 4, L = 8192.
// Wavelength λ_i = 2π·θ^(2i/d): λ < 2048 kept; λ > 8192 divided by 8; otherwise
// s = (8192/λ − 1)/3 and f = (1 − s)·f/8 + s·f.
TEST(Rope, Llama31) {
  RopeConfig c;
  c.type = "llama3";
  c.theta = 500000.0;
  c.head_dim = 128;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position_embeddings = 8192;
  const Rope r(c);
  ASSERT_EQ(r.inv_freq().size(), 64u);
  EXPECT_EQ(r.attention_scaling(), 1.0);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128.0);
    const double lambda = 2 * kPi / f;
    double want;
    if (lambda < 2048.0) {
      want = f, ++kept;
    } else if (lambda > 8192.0) {
      want = f / 8.0, ++divided;
    } else {
      const double s = (8192.0 / lambda - 1.0) / 3.0;
      want = (1 - s) * f / 8.0 + s * f, ++smoothed;
    }
    expect_rel(r.inv_freq()[i], want, kFormulaRel, "llama3 inv_freq[" + std::to_string(i) + "]");
  }
  // Known split for these parameters: λ_i = 2π·θ^(i/64) passes 2048 at i = 28.2 and 8192 at
  // i = 34.98, so i <= 28 kept, 29..34 smoothed, i >= 35 divided.
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(smoothed, 6);
  EXPECT_EQ(divided, 29);
}

TEST(Rope, UnknownTypeThrows) {
  RopeConfig c;
  c.type = "longrope";
  c.head_dim = 64;
  EXPECT_THROW(Rope{c}, slope::Error);
  c.type = "default";
  c.head_dim = 63;
  EXPECT_THROW(Rope{c}, slope::Error);
}

// Naive reference: x1' = x1·c − x2·s, x2' = x2·c + x1·s with c, s = scaling·cos/sin(p·f_i).
void reference_rotate(std::vector<double>& x, int64_t n, int64_t H, int64_t D,
                      const std::vector<int64_t>& pos, const Rope& r) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = double(pos[t]) * r.inv_freq()[i];
        const double c = std::cos(a) * r.attention_scaling(), s = std::sin(a) * r.attention_scaling();
        double& x1 = x[(t * H + h) * D + i];
        double& x2 = x[(t * H + h) * D + D / 2 + i];
        const double a1 = x1, a2 = x2;
        x1 = a1 * c - a2 * s;
        x2 = a2 * c + a1 * s;
      }
}

TEST(Rope, ApplyMatchesReference) {
  for (const RopeConfig& c : {gpt_oss_config(), RopeConfig{.type = "default", .head_dim = 34}}) {
    const Rope r(c);
    const int64_t D = c.head_dim;
    for (auto [n, H] : {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {130, 8}}) {
      const auto x0 = random_floats(n * H * D, uint32_t(n * H));
      // Contiguous positions starting far out (1M tokens), and an arbitrary position list.
      for (int mode = 0; mode < 2; ++mode) {
        std::vector<int64_t> pos(n);
        std::mt19937 rng(5);
        for (int64_t t = 0; t < n; ++t) pos[t] = mode == 0 ? 1000003 + t : int64_t(rng() % 2000000);
        auto x = x0;
        if (mode == 0) r.apply(x.data(), n, H, pos[0]);
        else r.apply(x.data(), n, H, pos.data());
        std::vector<double> ref(x0.begin(), x0.end());
        reference_rotate(ref, n, H, D, pos, r);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(x[i], ref[i], kApplyTol * r.attention_scaling())
              << c.type << " n=" << n << " H=" << H << " mode=" << mode << " i=" << i;
      }
    }
  }
}

// split_apply: the q and k column ranges of fused rows rotated, v copied, in one pass; bit for
// bit the copy-then-apply path, and within the reference's tolerance (odd head counts, a
// head_dim that is not a multiple of the vector width, positions far out).
TEST(Rope, SplitApplyEqualsCopyThenApply) {
  for (const RopeConfig& c : {gpt_oss_config(), RopeConfig{.type = "default", .head_dim = 34}}) {
    const Rope r(c);
    const int64_t D = c.head_dim;
    for (auto [n, Hq, Hkv] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {17, 3, 1}, {130, 8, 2}}) {
      const int64_t width = (Hq + 2 * Hkv) * D;
      const auto qkv = random_floats(n * width, uint32_t(n * Hq + Hkv));
      std::vector<int64_t> pos(n);
      std::mt19937 rng(7);
      for (auto& p : pos) p = int64_t(rng() % 2000000);
      std::vector<float> q(n * Hq * D), k(n * Hkv * D), v(n * Hkv * D);
      r.split_apply(qkv.data(), n, Hq, Hkv, pos.data(), q.data(), k.data(), v.data());
      std::vector<float> q2(q.size()), k2(k.size()), v2(v.size());
      for (int64_t t = 0; t < n; ++t) {
        const float* row = qkv.data() + t * width;
        std::copy(row, row + Hq * D, q2.begin() + t * Hq * D);
        std::copy(row + Hq * D, row + (Hq + Hkv) * D, k2.begin() + t * Hkv * D);
        std::copy(row + (Hq + Hkv) * D, row + width, v2.begin() + t * Hkv * D);
      }
      std::vector<double> qref(q2.begin(), q2.end()), kref(k2.begin(), k2.end());
      reference_rotate(qref, n, Hq, D, pos, r);
      reference_rotate(kref, n, Hkv, D, pos, r);
      r.apply(q2.data(), n, Hq, pos.data());
      r.apply(k2.data(), n, Hkv, pos.data());
      const std::string what = c.type + " n=" + std::to_string(n) + " Hq=" + std::to_string(Hq);
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_EQ(q[i], q2[i]) << what << " q i=" << i;
        ASSERT_NEAR(q[i], qref[i], kApplyTol * r.attention_scaling()) << what << " q i=" << i;
      }
      for (size_t i = 0; i < k.size(); ++i) {
        ASSERT_EQ(k[i], k2[i]) << what << " k i=" << i;
        ASSERT_NEAR(k[i], kref[i], kApplyTol * r.attention_scaling()) << what << " k i=" << i;
        ASSERT_EQ(v[i], v2[i]) << what << " v i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace slope::kernels
