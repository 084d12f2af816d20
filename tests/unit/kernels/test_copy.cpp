// The data-movement ops against plain index arithmetic, on odd sizes (exact: they only move and
// add floats).
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

#include "slope/core/half.h"
#include "slope/kernels/copy.h"

namespace {

using namespace slope;

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(CopyOps, CopyColumnsTakesTheSliceOfEveryRow) {
  for (auto [rows, src_cols, col0, cols] : {std::array<int64_t, 4>{1, 1, 0, 1}, {7, 13, 3, 5}, {300, 257, 256, 1}, {513, 96, 0, 96}}) {
    const std::vector<float> src = random_floats(size_t(rows * src_cols), unsigned(rows + cols));
    std::vector<float> dst(size_t(rows * (cols + 2)), -7.f);
    kernels::copy_columns(src.data(), rows, src_cols, col0, cols, dst.data(), cols + 2);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dst[r * (cols + 2) + c], src[r * src_cols + col0 + c]);
      EXPECT_EQ(dst[r * (cols + 2) + cols], -7.f) << "wrote past the row";
    }
  }
}

TEST(CopyOps, TransposeSwapsIndices) {
  for (auto [rows, cols] : {std::array<int64_t, 2>{1, 1}, {1, 70}, {33, 65}, {200, 31}}) {
    const std::vector<float> src = random_floats(size_t(rows * cols), unsigned(rows * cols));
    std::vector<float> dst(src.size());
    kernels::transpose(src.data(), rows, cols, dst.data());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(dst[j * rows + i], src[i * cols + j]);
  }
}

TEST(CopyOps, AddInplace) {
  for (int64_t n : {1, 17, 100003}) {
    const std::vector<float> x = random_floats(size_t(n), 1), y0 = random_floats(size_t(n), 2);
    std::vector<float> y = y0;
    kernels::add_inplace(y.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]);
  }
}

TEST(CopyOps, GatherRowsConvertsEveryDtypeExactly) {
  const int64_t V = 11, W = 9;
  const std::vector<float> table = random_floats(size_t(V * W), 3);
  std::vector<uint16_t> bf(table.size()), hf(table.size());
  std::mt19937 rng(4);
  for (size_t i = 0; i < table.size(); ++i) {
    bf[i] = f32_to_bf16(table[i]);
    hf[i] = uint16_t(rng() % 0x7c00u | (rng() & 1u) << 15);  // any finite f16, either sign
  }
  const std::vector<int32_t> ids{10, 0, 3, 3, 7};
  std::vector<float> out(ids.size() * W);
  kernels::gather_rows_f32(table.data(), DType::F32, W, ids.data(), int64_t(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < W; ++j) ASSERT_EQ(out[i * W + j], table[ids[i] * W + j]);
  kernels::gather_rows_f32(bf.data(), DType::BF16, W, ids.data(), int64_t(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < W; ++j) ASSERT_EQ(out[i * W + j], bf16_to_f32(bf[ids[i] * W + j]));
  kernels::gather_rows_f32(hf.data(), DType::F16, W, ids.data(), int64_t(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < W; ++j) ASSERT_EQ(out[i * W + j], f16_to_f32(hf[ids[i] * W + j]));
}

}  // namespace
