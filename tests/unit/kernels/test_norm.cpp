// RMSNorm against a double-precision reference.
//
// Tolerances: F32 output within 1e-5 relative of the double result (f32 sum of squares and
// rsqrt). BF16 outputs must be bf16 values and within one bf16 ulp (at most 2^-7 relative) of
// the reference with the same cast points, two for CastThenWeight (two roundings), since the
// f32 kernel and the double reference may land on opposite sides of a rounding midpoint;
// nearly all must agree exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/kernels/gemm.h"
#include "slope/kernels/norm.h"

namespace slope::kernels {
namespace {

constexpr double kF32Rel = 1e-5;
constexpr double kBf16Ulp = 1.0 / 128.0;  // one ulp is at most 2^-7 relative (8-bit significand)

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// out = w·y (F32), (w·y).to(bf16) (WeightThenCast), w·y.to(bf16) in bf16 (CastThenWeight).
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              int64_t rows, int64_t dim, double eps, NormOrder order,
                              DType act) {
  std::vector<double> out(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const double y = x[r * dim + i] * inv;
      double o;
      if (act == DType::F32) o = w[i] * y;
      else if (order == NormOrder::WeightThenCast) o = round_bf16(float(w[i] * y));
      else o = round_bf16(float(w[i] * double(round_bf16(float(y)))));
      out[r * dim + i] = o;
    }
  }
  return out;
}

TEST(RmsNorm, MatchesReferenceAllOrdersAndDtypes) {
  const float eps = 1e-5f;
  for (int64_t dim : {1, 33, 64, 2881})
    for (int64_t rows : {1, 3, 17, 130}) {
      const auto x = random_floats(rows * dim, uint32_t(dim * 7 + rows), -3.f, 3.f);
      const auto w = random_floats(dim, uint32_t(dim), 0.5f, 1.5f);
      for (NormOrder order : {NormOrder::WeightThenCast, NormOrder::CastThenWeight})
        for (DType act : {DType::F32, DType::BF16}) {
          std::vector<float> y(x.size());
          rmsnorm(x.data(), w.data(), y.data(), rows, dim, eps, order, act);
          const auto ref = reference(x, w, rows, dim, eps, order, act);
          int64_t exact = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            if (act == DType::F32) {
              ASSERT_NEAR(y[i], ref[i], kF32Rel * std::abs(ref[i]) + 1e-30)
                  << "dim=" << dim << " rows=" << rows << " i=" << i;
            } else {
              ASSERT_EQ(y[i], round_bf16(y[i])) << "not a bf16 value at " << i;
              const double ulps = order == NormOrder::CastThenWeight ? 2.0 : 1.0;
              ASSERT_LE(std::abs(y[i] - ref[i]), ulps * kBf16Ulp * std::abs(ref[i]))
                  << "dim=" << dim << " rows=" << rows << " order=" << int(order) << " i=" << i;
              exact += y[i] == ref[i];
            }
          }
          if (act == DType::BF16) {
            EXPECT_GE(exact, int64_t(0.99 * double(y.size())));
          }
        }
    }
}

// rmsnorm_bf16: its bf16 rows are to_bf16 of rmsnorm(..., BF16) bit for bit and its f32 rows are
// rmsnorm's, for both orders, odd widths (vector tails, blocks of 256 and a partial one) and y
// aliasing x; the bf16 values also meet the double reference as rmsnorm's do.
TEST(RmsNorm, Bf16RowsEqualTheRoundedF32Rows) {
  const float eps = 1e-5f;
  for (int64_t dim : {1, 31, 64, 257, 1030})
    for (int64_t rows : {1, 7, 40}) {
      const auto x = random_floats(rows * dim, uint32_t(dim * 11 + rows), -3.f, 3.f);
      const auto w = random_floats(dim, uint32_t(dim + 3), 0.5f, 1.5f);
      for (NormOrder order : {NormOrder::WeightThenCast, NormOrder::CastThenWeight}) {
        std::vector<float> y(x.size());
        rmsnorm(x.data(), w.data(), y.data(), rows, dim, eps, order, DType::BF16);
        std::vector<uint16_t> want(x.size()), got(x.size());
        to_bf16(y.data(), want.data(), rows * dim);
        std::vector<float> yf = x;  // in place
        rmsnorm_bf16(yf.data(), w.data(), got.data(), yf.data(), rows, dim, eps, order);
        std::vector<uint16_t> only(x.size());
        rmsnorm_bf16(x.data(), w.data(), only.data(), nullptr, rows, dim, eps, order);
        const auto ref = reference(x, w, rows, dim, eps, order, DType::BF16);
        int64_t exact = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(got[i], want[i]) << "dim=" << dim << " rows=" << rows << " order=" << int(order) << " i=" << i;
          ASSERT_EQ(only[i], want[i]) << "without f32 rows, i=" << i;
          ASSERT_EQ(yf[i], y[i]) << "f32 rows, i=" << i;
          const double v = bf16_to_f32(got[i]);
          const double ulps = order == NormOrder::CastThenWeight ? 2.0 : 1.0;
          ASSERT_LE(std::abs(v - ref[i]), ulps * kBf16Ulp * std::abs(ref[i])) << "i=" << i;
          exact += v == ref[i];
        }
        EXPECT_GE(exact, int64_t(0.99 * double(x.size())));
      }
    }
}

TEST(RmsNorm, Bf16RejectsAnEmptyRow) {
  const std::vector<float> x(4, 1.f), w(4, 1.f);
  std::vector<uint16_t> yb(4);
  EXPECT_THROW(rmsnorm_bf16(x.data(), w.data(), yb.data(), nullptr, 1, 0, 1e-5f, NormOrder::WeightThenCast),
               slope::Error);
}

TEST(RmsNorm, InPlace) {
  const int64_t rows = 5, dim = 130;
  const auto x0 = random_floats(rows * dim, 1, -2.f, 2.f);
  const auto w = random_floats(dim, 2, 0.5f, 1.5f);
  std::vector<float> y(x0.size()), x = x0;
  rmsnorm(x0.data(), w.data(), y.data(), rows, dim, 1e-6f, NormOrder::CastThenWeight, DType::BF16);
  rmsnorm(x.data(), w.data(), x.data(), rows, dim, 1e-6f, NormOrder::CastThenWeight, DType::BF16);
  EXPECT_EQ(x, y);
}

TEST(RmsNorm, ZeroRowGivesZero) {
  const std::vector<float> x(40, 0.f), w(40, 1.f);
  std::vector<float> y(40, 1.f);
  rmsnorm(x.data(), w.data(), y.data(), 1, 40, 1e-5f, NormOrder::WeightThenCast);
  for (float v : y) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace slope::kernels
