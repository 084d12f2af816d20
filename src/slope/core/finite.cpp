#include "slope/core/finite.h"

#include <cstring>

namespace slope {
namespace {

// An IEEE value is NaN or Inf exactly when its exponent bits are all ones. Elements are read
// through memcpy (no aliasing of float as an integer); compilers turn it into vector loads.
template <typename Bits>
bool is_bad(const void* x, int64_t i, Bits exponent) {
  Bits u;
  std::memcpy(&u, static_cast<const char*>(x) + i * int64_t(sizeof(Bits)), sizeof(Bits));
  return (u & exponent) == exponent;
}

template <typename Bits>
bool block_finite(const void* x, int64_t lo, int64_t n, Bits exponent) {
  Bits bad = 0;
  for (int64_t i = lo; i < lo + n; ++i) bad |= Bits(is_bad(x, i, exponent));
  return bad == 0;
}

template <typename Bits>
int64_t first_bad(const void* x, int64_t n, Bits exponent) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  int64_t first_block = blocks;
  // Blocks in parallel for large buffers; the first bad block is the minimum.
#pragma omp parallel for schedule(static) reduction(min : first_block) if (n > (int64_t{1} << 20))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, len = n - lo < kBlock ? n - lo : kBlock;
    if (!block_finite(x, lo, len, exponent) && b < first_block) first_block = b;
  }
  if (first_block == blocks) return -1;
  for (int64_t i = first_block * kBlock;; ++i)
    if (is_bad(x, i, exponent)) return i;
}

}  // namespace

int64_t first_nonfinite(const float* x, int64_t n) {
  static_assert(sizeof(float) == sizeof(uint32_t));
  return first_bad(x, n, uint32_t{0x7f800000});
}

bool all_finite(const float* x, int64_t n) { return first_nonfinite(x, n) < 0; }

int64_t first_nonfinite(const Tensor& t) {
  if (t.empty()) return -1;
  switch (t.dtype()) {
    case DType::F32: return first_nonfinite(t.data<float>(), t.numel());
    case DType::BF16: return first_bad(t.data<uint16_t>(), t.numel(), uint16_t{0x7f80});
    case DType::F16: return first_bad(t.data<uint16_t>(), t.numel(), uint16_t{0x7c00});
    default: return -1;
  }
}

}  // namespace slope
