// MXFP4 dequantisation: exact (bit-for-bit) against hand-built blocks and a naive decoder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "slope/kernels/mxfp4.h"

namespace slope::kernels {
namespace {

// e2m1 by hand: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 subnormal.
constexpr double kFp4[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                             -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

float expected(int nibble, int scale) {
  const double v = kFp4[nibble] * std::pow(2.0, scale - 127);  // exact in double
  if (std::abs(v) > std::numeric_limits<float>::max())            // beyond f32: ±inf, as ldexp
    return std::copysign(std::numeric_limits<float>::infinity(), float(kFp4[nibble]));
  return float(v);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// One block whose element e holds nibble e % 16: byte j = (2j % 16) | ((2j+1) % 16) << 4.
std::vector<uint8_t> every_nibble_block() {
  std::vector<uint8_t> b(16);
  for (int j = 0; j < 16; ++j) b[j] = uint8_t(((2 * j) % 16) | (((2 * j + 1) % 16) << 4));
  return b;
}

TEST(Mxfp4, EveryNibbleAtManyScales) {
  const int scales[] = {127, 128, 126, 0, 1, 2, 100, 130, 200, 253, 254, 255};
  const int64_t rows = sizeof(scales) / sizeof(int);
  std::vector<uint8_t> blocks, sc;
  for (int64_t r = 0; r < rows; ++r) {
    const auto b = every_nibble_block();
    blocks.insert(blocks.end(), b.begin(), b.end());
    sc.push_back(uint8_t(scales[r]));
  }
  std::vector<float> out(rows * 32, 123.f);
  mxfp4_dequantize(blocks.data(), sc.data(), rows, 1, out.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int e = 0; e < 32; ++e) {
      const float want = expected(e % 16, scales[r]);
      EXPECT_TRUE(same_bits(out[r * 32 + e], want))
          << "scale " << scales[r] << " element " << e << ": got " << out[r * 32 + e] << " want "
          << want;
    }
}

TEST(Mxfp4, HandPickedValues) {
  // Scale 127 is ×1: the table itself.
  std::vector<uint8_t> b = every_nibble_block(), s = {127};
  std::vector<float> out(32);
  mxfp4_dequantize(b.data(), s.data(), 1, 1, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[7], 6.0f);
  EXPECT_EQ(out[8], 0.0f);
  EXPECT_TRUE(std::signbit(out[8]));  // −0
  EXPECT_EQ(out[15], -6.0f);
  EXPECT_EQ(out[16 + 5], 3.0f);
  // Scale 129 (×4), byte 0x7A: element 0 = nibble A = −1 → −4, element 1 = nibble 7 = 6 → 24.
  b.assign(16, 0);
  b[0] = 0x7A;
  s = {129};
  mxfp4_dequantize(b.data(), s.data(), 1, 1, out.data());
  EXPECT_EQ(out[0], -4.0f);
  EXPECT_EQ(out[1], 24.0f);
  for (int e = 2; e < 32; ++e) EXPECT_EQ(out[e], 0.0f);
  // Extremes: scale 0 gives subnormals (0.5·2^-127 = 2^-128), 254 the largest finite values
  // (1.5·2^127; 6·2^127 would overflow), 255 overflows 1.5·2^128 to inf (as ldexp does) while
  // 0.5·2^128 = 2^127 stays finite.
  b[0] = 0x31;  // elements 0.5, 1.5
  for (auto [scale, e0, e1] : {std::tuple<int, float, float>{0, std::ldexp(1.f, -128), std::ldexp(1.5f, -127)},
                               {254, std::ldexp(1.f, 126), std::ldexp(1.5f, 127)},
                               {255, std::ldexp(1.f, 127), std::numeric_limits<float>::infinity()}}) {
    s = {uint8_t(scale)};
    mxfp4_dequantize(b.data(), s.data(), 1, 1, out.data());
    EXPECT_EQ(out[0], e0) << "scale " << scale;
    EXPECT_EQ(out[1], e1) << "scale " << scale;
  }
}

TEST(Mxfp4, RandomBlocksMatchNaiveDecoder) {
  std::mt19937 rng(42);
  for (auto [rows, nblocks] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {33, 90}, {300, 3}}) {
    std::vector<uint8_t> blocks(rows * nblocks * 16), scales(rows * nblocks);
    for (auto& v : blocks) v = uint8_t(rng());
    for (auto& v : scales) v = uint8_t(110 + rng() % 30);
    std::vector<float> out(rows * nblocks * 32);
    mxfp4_dequantize(blocks.data(), scales.data(), rows, nblocks, out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < nblocks * 32; ++k) {
        const int64_t blk = r * nblocks + k / 32, j = (k % 32) / 2;
        const uint8_t byte = blocks[blk * 16 + j];
        const int nib = (k % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        ASSERT_TRUE(same_bits(out[r * nblocks * 32 + k], expected(nib, scales[blk])))
            << "rows=" << rows << " nblocks=" << nblocks << " r=" << r << " k=" << k;
      }
  }
}

}  // namespace
}  // namespace slope::kernels
