// Core types: dtype names, half-precision conversions against exact references, tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <malloc.h>
#include <limits>
#include <random>

#include "slope/core/dtype.h"
#include "slope/core/error.h"
#include "slope/core/half.h"
#include "slope/core/tensor.h"
#include "../bf16_reference.h"

using namespace slope;

namespace {

using slope::testing::bf16_reference;

TEST(Core, DtypeNamesRoundTrip) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::U8, DType::I32, DType::I64})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  try {
    parse_dtype("F8_E9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F8_E9"), std::string::npos);
  }
}

TEST(Core, Bf16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1e4f, 1e4f);
  for (int i = 0; i < 100000; ++i) {
    const float x = d(rng);
    EXPECT_EQ(round_bf16(x), bf16_reference(x)) << x;
  }
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(Core, F16DecodesEveryValue) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double want;
    if (exp == 0) want = std::ldexp(double(man), -24);
    else if (exp == 31) want = man ? std::nan("") : INFINITY;
    else want = std::ldexp(1.0 + man / 1024.0, int(exp) - 15);
    if (sign) want = -want;
    const float got = f16_to_f32(uint16_t(h));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << h;
    else EXPECT_EQ(double(got), want) << h;
  }
}

TEST(Core, TensorAllocConvertReshape) {
  Tensor t({2, 3}, DType::BF16);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  for (int i = 0; i < 6; ++i) t.data<uint16_t>()[i] = f32_to_bf16(float(i) - 2.5f);
  Tensor f = t.to_f32();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f.data<float>()[i], float(i) - 2.5f);
  EXPECT_EQ(f.reshape({3, 2}).dim(0), 3);
  EXPECT_THROW(f.reshape({4, 2}), Error);
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
}

}  // namespace

// Large tensors are zeroed in parts by all threads (tensor.cpp): every byte is 0 even where the
// storage reuses memory a previous tensor dirtied. Allocations stay on the heap (no fresh mmap
// pages, which would read 0 without any zeroing) so that the second tensor gets the first's bytes.
TEST(Core, LargeTensorIsZeroedOnReusedMemory) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest setting
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  const slope::Shape shape{5 * 1024 * 1024 + 3};  // past 4 MiB of parts, with a partial last part
  // Dirty a tensor's storage, free it, allocate again, until the allocator hands the same bytes
  // back (where other allocations sit beside it, it may place the next one elsewhere).
  const void* dirtied = nullptr;
  for (int attempt = 0; attempt < 16; ++attempt) {
    slope::Tensor t(shape, slope::DType::U8);
    if (t.raw() == dirtied) {
      const auto* b = static_cast<const unsigned char*>(t.raw());
      for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(b[i], 0) << "byte " << i;
      return;
    }
    std::memset(t.raw(), 0xab, t.nbytes());
    dirtied = t.raw();
  }
  GTEST_SKIP() << "the allocator never reused a freed tensor's storage";
}
